"""GET /v1/models, GET /v1/models/{model_id}"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from server.deps import EngineDep, EngineLike, check_model

router = APIRouter()


def _card(engine: EngineLike, created: int) -> dict[str, Any]:
    info = engine.info
    return {
        "id": info.model_id,
        "object": "model",
        "created": created,
        "owned_by": "kvserve",
        "meta": {
            "description": info.description,
            "n_ctx": info.n_ctx,
            "n_ctx_train": info.n_ctx_train,
            "n_vocab": info.n_vocab,
            "n_embd": info.n_embd,
            "n_params": info.n_params,
            "size": info.size_bytes,
            "slots": info.n_seq_max,
        },
    }


@router.get("/v1/models")
async def list_models(request: Request, engine: EngineDep) -> dict[str, Any]:
    """List the models this server serves."""
    return {"object": "list", "data": [_card(engine, request.app.state.started)]}


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request, engine: EngineDep) -> dict[str, Any]:
    """Describe one model; 404 if this server does not serve it."""
    check_model(engine, model_id)
    return _card(engine, request.app.state.started)
