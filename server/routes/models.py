"""GET /v1/models, GET /v1/models/{model_id}

The list has one entry per served model, under its id (OpenAI's shape); aliases are
named in its `meta` and are accepted wherever a model is named, retrieval included.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from server.deps import registry, resolve_model
from server.registry import ServedModel

router = APIRouter()


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
        # llama-server's /lora-adapters shape: the index is what `lora[].id` may also be
        "loras": [{"id": i, "index": n, "scale": s} for n, (i, s) in enumerate(served.loras)],
    }
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
        }
    card["meta"] = meta
    return card


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    """List the models this server serves (also those still loading)."""
    created = request.app.state.started
    return {"object": "list", "data": [_card(m, created) for m in registry(request)]}


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request) -> dict[str, Any]:
    """Describe one model (by id or alias); 404 if this server does not serve it."""
    served = resolve_model(request, model_id, require_ready=False)
    return _card(served, request.app.state.started)
