"""`[hub]`, and where a model's or an adapter's GGUF lives on a Hugging Face-compatible
hub (`hf_repo` in a `[[models]]` entry): parsed by the config's checks at start and by the
downloads (server/models/hub.py), which fail with the same `HubError`."""

from __future__ import annotations

import dataclasses
from typing import Annotated

from pydantic import Field
from pydantic.dataclasses import dataclass


@dataclass(frozen=True)
class HubSection:
    """Downloads from a Hugging Face-compatible hub (HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE
    are read from the environment by huggingface_hub itself)."""

    cache_dir: str = ""  # empty: huggingface_hub's cache (HF_HUB_CACHE, ~/.cache/huggingface)
    # POST /api/pull: downloads at once (each holds a thread of its own); more: 429
    max_concurrent_pulls: Annotated[int, Field(ge=1)] = 2
    # what the hub cache may hold after a pull; a file that would pass it is refused
    # before its first byte (507), as is one larger than the disk's free space; 0: no budget
    max_cache_bytes: Annotated[int, Field(ge=0)] = 0


class HubError(Exception):
    """A model could not be fetched; the message is one line naming the key."""


@dataclasses.dataclass(frozen=True, slots=True)
class HubSource:
    """Where a model's GGUF lives on the hub. `quant` picks the file when `file` is empty."""

    key: str  # the config key, for messages: "models[0].hf_repo"
    repo: str
    file: str = ""
    quant: str = ""
    revision: str = ""  # empty: the default branch
    cache_dir: str = ""  # empty: huggingface_hub's own (HF_HUB_CACHE)

    @classmethod
    def parse(
        cls, key: str, spec: str, file: str = "", revision: str = "", cache_dir: str = ""
    ) -> HubSource:
        """From `org/name[:QUANT]` (llama-server's -hf syntax)."""
        repo, _, quant = spec.partition(":")
        if repo.count("/") != 1 or not all(repo.split("/")):
            raise HubError(f"{key}: expected org/name[:QUANT], got {spec!r}")
        if quant and file:
            raise HubError(f"{key}: give either a quant tag or hf_file, not both")
        return cls(key, repo, file, quant, revision, cache_dir)
