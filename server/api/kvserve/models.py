"""GET /v1/models, GET /v1/models/{model_id}, POST /v1/models/{model_id}/load|unload

The list has one entry per served model, under its id (OpenAI's shape); aliases are
named in its `meta` and are accepted wherever a model is named, retrieval included.
`meta.state` is loaded, loading, unloaded, failed or recovering (the engine thread died
and is being rebuilt); load and unload do it by hand (see server/models/loader.py): model
management, which server/http/management.py says who may do.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from engine.client import EngineRecoveringError, EngineState
from server.api.kvserve.props import modalities
from server.errors import APIError, from_engine_error
from server.http.deps import registry, resolve_model
from server.http.management import require_manager
from server.models.loader import ModelLoader
from server.models.served import ServedModel, family_of

router = APIRouter()

_STATES = {
    EngineState.READY: "loaded",
    EngineState.LOADING: "loading",
    EngineState.UNLOADED: "unloaded",
    EngineState.STOPPED: "unloaded",
    EngineState.FAILED: "failed",
    EngineState.RECOVERING: "recovering",
}


class ModelBusy(APIError):
    status = 409


def _card(served: ServedModel, created: int) -> dict[str, Any]:
    card: dict[str, Any] = {
        "id": served.id,
        "object": "model",
        "created": created,
        "owned_by": "kvserve",
    }
    meta: dict[str, Any] = {
        "aliases": list(served.aliases),
        "ready": served.engine.ready,
        "state": _STATES[served.engine.state],
        "load": "on_demand" if served.on_demand else "startup",
        # llama-server's /lora-adapters shape: the index is what `lora[].id` may also be
        "loras": [{"id": i, "index": n, "scale": s} for n, (i, s) in enumerate(served.loras)],
    }
    if served.engine.state is EngineState.FAILED:
        meta["error"] = served.engine.load_error
    if served.engine.ready:
        info = served.engine.info
        meta |= {
            "description": info.description,
            "n_ctx": info.n_ctx,
            "n_ctx_train": info.n_ctx_train,
            "n_vocab": info.n_vocab,
            "n_embd": info.n_embd,
            "n_params": info.n_params,
            "size": info.size_bytes,
            "slots": info.n_seq_max,
            "family": family_of(info),
            # the vocabulary's special token ids (None: none), as GET /props shows them
            "special_tokens": info.special_tokens.as_dict(),
            # what prompts may carry, as GET /props says it: vision with a projector
            "modalities": modalities(info.vision),
        }
    card["meta"] = meta
    return card


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    """List the models this server serves (also those still loading)."""
    request.app.state.hub_models.rescan()  # what other replicas pulled or deleted
    created = request.app.state.started
    return {"object": "list", "data": [_card(m, created) for m in registry(request)]}


def _loader(request: Request) -> ModelLoader:
    return request.app.state.loader  # type: ignore[no-any-return]


@router.post("/v1/models/{model_id:path}/load", dependencies=[Depends(require_manager)])
async def load_model(model_id: str, request: Request) -> dict[str, Any]:
    """Load a model now and wait for it (503 with the reason if it fails)."""
    served = resolve_model(request, model_id, require_ready=False)
    await _loader(request).ensure_loaded(served, retry_now=True)
    return _card(served, request.app.state.started)


@router.post("/v1/models/{model_id:path}/unload", dependencies=[Depends(require_manager)])
async def unload_model(model_id: str, request: Request) -> dict[str, Any]:
    """Unload a model (its slots' KV is saved to the cache first); 409 while it serves
    or loads."""
    served = resolve_model(request, model_id, require_ready=False)
    if served.engine.state is EngineState.RECOVERING:
        raise from_engine_error(EngineRecoveringError(f"the model '{served.id}' is being rebuilt"))
    if not await _loader(request).unload(served) and served.engine.ready:
        raise ModelBusy(f"the model '{served.id}' has requests in flight", code="model_busy")
    return _card(served, request.app.state.started)


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request) -> dict[str, Any]:
    """Describe one model (by id or alias); 404 if this server does not serve it."""
    served = resolve_model(request, model_id, require_ready=False)
    return _card(served, request.app.state.started)
