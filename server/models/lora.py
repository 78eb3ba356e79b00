"""The `lora` request field (llama-server's name): which adapters apply, at what scale.

Shared by every generating route (chat, completions, responses, messages): a route's
request model declares `lora: list[LoraRef] | None` and hands it on as (id, scale)
pairs, and `lora_set` turns those into the engine's effective set against the model's
configured adapters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from engine.client import ModelInfo
from server.http.errors import BadRequest

LoraScale = Annotated[float, Field(ge=-100.0, le=100.0)]


class LoraRef(BaseModel):
    """One adapter of a request: its configured id (or, as llama-server, its index)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    id: Annotated[str, Field(min_length=1, max_length=256)] | Annotated[int, Field(ge=0)]
    scale: LoraScale = 1.0


# The field as a request model declares it: `lora: LoraField = None`.
LoraField = Annotated[list[LoraRef], Field(max_length=64)] | None


def lora_set(
    refs: Sequence[tuple[str | int, float]] | None, info: ModelInfo
) -> tuple[tuple[str, float], ...]:
    """The adapters a request runs with, as (id, scale) sorted by id, without zero scales.

    No `lora` field: each configured adapter at its configured scale. A `lora` list: the
    adapters it names at its scales, every other one at 0 (llama-server's rule). An
    adapter at scale 0 is the base model: leaving it out lets such requests share the
    base model's prefixes. Unknown ids are a 400 naming them."""
    if refs is None:
        return tuple(sorted((a.id, a.scale) for a in info.loras if a.scale != 0.0))
    ids = [a.id for a in info.loras]
    chosen: dict[str, float] = {}
    for i, (ref, scale) in enumerate(refs):
        if isinstance(ref, int):
            if ref >= len(ids):
                raise BadRequest(
                    f"lora[{i}].id: no adapter number {ref} (this model has {len(ids)})",
                    param="lora",
                )
            adapter_id = ids[ref]
        elif ref in ids:
            adapter_id = ref
        else:
            known = ", ".join(repr(a) for a in ids) or "none"
            raise BadRequest(
                f"lora[{i}].id: unknown LoRA adapter '{ref}' (this model has {known})",
                param="lora",
            )
        if adapter_id in chosen:
            raise BadRequest(f"lora[{i}].id: adapter '{adapter_id}' named twice", param="lora")
        chosen[adapter_id] = scale
    return tuple(sorted((i, s) for i, s in chosen.items() if s != 0.0))
