"""POST /tokenize, POST /detokenize (llama-server's shapes)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from server.api.kvserve.protocol import DetokenizeRequest, TokenizeRequest
from server.http.deps import EngineDep, GatedRoute
from server.http.errors import BadRequest

router = APIRouter(route_class=GatedRoute)  # reads the body the model gate parsed


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, engine: EngineDep) -> dict[str, Any]:
    """Turn text into the model's token ids."""
    tokens = engine.tokenize(
        body.content, add_special=body.add_special, parse_special=body.parse_special
    )
    if body.with_pieces:
        return {
            "tokens": [
                {"id": t, "piece": engine.token_bytes(t).decode("utf-8", "replace")} for t in tokens
            ]
        }
    return {"tokens": tokens}


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, engine: EngineDep) -> dict[str, Any]:
    """Turn token ids back into text."""
    n_vocab = engine.info.n_vocab
    bad = next((t for t in body.tokens if t >= n_vocab), None)
    if bad is not None:
        raise BadRequest(f"token id {bad} is outside [0, {n_vocab})", param="tokens")
    return {"content": engine.detokenize(body.tokens)}
