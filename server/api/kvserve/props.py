"""GET /props (llama-server's): a model's properties, in llama-server's shape.

llama-server's web UI and scripts read it: the context size and default sampler
settings, the slots, the chat template, the BOS/EOS text. kvserve adds `special_tokens`,
the vocabulary's special token ids (engine/special_tokens.py; also in /v1/models' meta).
`?model=` names the model, as llama-server's router mode (the default model without it).
A model that is not loaded is described by what is known without it, with
`is_sleeping: true` (llama-server's answer while its model sleeps); nothing is loaded.
"""

from __future__ import annotations

from dataclasses import asdict
from importlib import metadata
from typing import Any

from fastapi import APIRouter, Request

from server.errors import ServerError
from server.http.deps import claim, registry, resolve_model
from server.models.served import ServedModel
from server.serving.engine_requests import RequestSampling, sampling_params

router = APIRouter()

# Request-only sampler fields: no default to show.
_NOT_DEFAULTS = {"grammar", "grammar_lazy", "grammar_trigger_patterns",
                 "grammar_trigger_tokens", "grammar_trigger_words", "logit_bias"}  # fmt: skip


def _build_info() -> str:
    try:
        return f"kvserve {metadata.version('kvserve')}"
    except metadata.PackageNotFoundError:
        return "kvserve"


def modalities(vision: bool) -> dict[str, bool]:
    """llama-server's `modalities`: vision with a projector loaded; audio never."""
    return {"vision": vision, "audio": False}


def props_of(served: ServedModel) -> dict[str, Any]:
    out: dict[str, Any] = {
        "model_alias": served.id,
        "model_path": served.path,
        "modalities": {"vision": False, "audio": False},  # known once loaded (below)
        "build_info": _build_info(),
        "is_sleeping": not served.engine.ready,
    }
    if not served.engine.ready:
        return out
    info = served.engine.info
    out["modalities"] = modalities(info.vision)
    defaults = asdict(sampling_params(RequestSampling(), info))
    params = {k: v for k, v in defaults.items() if k not in _NOT_DEFAULTS}
    return out | {
        "default_generation_settings": {"n_ctx": info.n_ctx, "params": params},
        "total_slots": info.n_seq_max,
        "model_path": info.path,
        "chat_template": _template_source(served),
        "bos_token": info.bos_token,
        "eos_token": info.eos_token,
        "special_tokens": info.special_tokens.as_dict(),
    }


def _template_source(served: ServedModel) -> str:
    """The template chat requests render with; one that does not compile, as written
    (props describe the model; the chat routes name the error)."""
    try:
        return served.template.source
    except ServerError:
        return served.template_override or served.engine.info.chat_template or ""


@router.get("/props")
async def props(request: Request, model: str | None = None) -> dict[str, Any]:
    """A model's properties (llama-server's /props), the default model's without `model`."""
    if model is None:
        served = claim(registry(request).default, require_ready=False)
    else:
        served = resolve_model(request, model, require_ready=False)
    return props_of(served)
