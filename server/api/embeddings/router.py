"""POST /v1/embeddings"""

from __future__ import annotations

import base64
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Request

from server.api.embeddings.protocol import EmbeddingRequest
from server.errors import BadRequest
from server.http.deps import resolve_engine
from server.http.lease import Lease, leased
from server.serving.drive import until_disconnect
from server.serving.prompts import prompt_token_lists

router = APIRouter()


@router.post("/v1/embeddings")
async def create_embeddings(
    request: Request, lease: Annotated[Lease[EmbeddingRequest], leased(EmbeddingRequest)]
) -> Any:
    """Embed text or token ids: mean-pooled over tokens, unit length."""
    body = lease.body
    body.log_unknown("embeddings")
    engine = resolve_engine(request, body.model)
    n_embd = engine.info.n_embd
    if body.dimensions is not None and body.dimensions > n_embd:
        raise BadRequest(
            f"'dimensions' must be at most {n_embd} for this model", param="dimensions"
        )
    inputs = await prompt_token_lists(engine, body.input, param="input")
    vectors = await until_disconnect(request, engine.embed(inputs))
    data = []
    for i, vector in enumerate(vectors):
        if body.dimensions is not None:
            # Shortening as OpenAI does: keep the leading dimensions, then renormalise.
            vector = vector[: body.dimensions]
            vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
        vector = vector.astype("<f4", copy=False)
        embedding: Any = (
            base64.b64encode(vector.tobytes()).decode("ascii")
            if body.encoding_format == "base64"
            else vector.tolist()
        )
        data.append({"object": "embedding", "index": i, "embedding": embedding})
    num_tokens = sum(len(t) for t in inputs)
    return {
        "object": "list",
        "data": data,
        "model": engine.info.model_id,
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
    }
