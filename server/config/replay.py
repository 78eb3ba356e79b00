"""`[replay]`: the bound of the memory of sampled tool turns (server/serving/replay.py)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field
from pydantic.dataclasses import dataclass as pydantic_dataclass


@pydantic_dataclass(frozen=True)
class ReplaySection:
    """`[replay]`: sampled tool turns kept so that a call sent back renders as the tokens
    the model sampled, not as the template writes it again."""

    max_bytes: Annotated[int, Field(ge=0)] = 32 * 1024 * 1024  # per model, an LRU; 0: off
