"""POST /api/embed and the older POST /api/embeddings (Ollama): mean-pooled, unit-length
vectors from the engine's embedding context (as /v1/embeddings).

`truncate` (default true) cuts an input to the longest the model embeds; false refuses
it. `options.num_ctx` lowers that length; sampling options mean nothing here and are
refused by name.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from fastapi import Request

from server.api.ollama.common import check_num_ctx, kept_model, load_wait_s
from server.api.ollama.protocol import (
    OllamaEmbeddingsRequest,
    OllamaEmbedRequest,
    OllamaOptions,
)
from server.errors import BadRequest, Unsupported
from server.models.keep_alive import apply_keep_alive
from server.models.served import ServedModel
from server.serving.drive import tokenize, until_disconnect


def _limit(served: ServedModel, model: str, opts: OllamaOptions) -> int:
    """The most tokens one input may have here."""
    info = served.engine.info
    if info.embed_n_ctx == 0:
        raise BadRequest(f'"{model}" does not support embeddings', param="model")
    check_num_ctx(opts, info.n_ctx)
    sampling = sorted(opts.model_fields_set - {"num_ctx"})
    if sampling:
        raise Unsupported(f"options.{sampling[0]}", "embeddings take no sampling options")
    return min(info.embed_n_ctx, opts.num_ctx or info.embed_n_ctx)


async def _vectors(
    request: Request, served: ServedModel, texts: list[str], limit: int, truncate: bool,
    keep_alive: float | None,
) -> tuple[list[np.ndarray], int]:  # fmt: skip
    """The embeddings and how many tokens they took; the
    request's keep_alive applies once its inputs have passed."""
    engine = served.engine
    inputs = []
    for i, text in enumerate(texts):
        tokens = await tokenize(engine, text, add_special=engine.info.add_bos,
                                parse_special=False)  # fmt: skip
        if len(tokens) > limit and not truncate:
            raise BadRequest(f"input[{i}] has {len(tokens)} tokens, more than the {limit} "
                             "this model embeds (truncate is false)", param="input")  # fmt: skip
        inputs.append(tokens[:limit])
    apply_keep_alive(served, keep_alive)
    vectors = await until_disconnect(request, engine.embed(inputs))
    return vectors, sum(len(t) for t in inputs)


async def serve_ollama_embed(body: OllamaEmbedRequest, request: Request) -> Any:
    started = time.monotonic()
    body.log_unknown("ollama.embed")
    served = kept_model(request, body.model, body.keep_alive)
    limit = _limit(served, body.model, body.options)
    n_embd = served.engine.info.n_embd
    if body.dimensions is not None and body.dimensions > n_embd:
        raise BadRequest(f"'dimensions' must be at most {n_embd} for this model",
                         param="dimensions")  # fmt: skip
    if isinstance(body.input, str):
        texts = [body.input] if body.input else []  # empty: only loads the model
    else:
        texts = body.input
        empty = next((i for i, t in enumerate(texts) if not t), None)
        if empty is not None:
            raise BadRequest(f"input[{empty}] is an empty string", param="input")
    vectors: list[np.ndarray] = []
    num_tokens = 0
    if texts:
        result = await _vectors(request, served, texts, limit, body.truncate, body.keep_alive)
        vectors, num_tokens = result
    else:
        apply_keep_alive(served, body.keep_alive)
    out = []
    for vector in vectors:
        if body.dimensions is not None:  # keep the leading dimensions, then renormalise
            vector = vector[: body.dimensions]
            vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
        out.append(vector.astype("<f4", copy=False).tolist())
    load_s = load_wait_s(request)
    return {
        "model": body.model,
        "embeddings": out,
        "total_duration": int((time.monotonic() - started + load_s) * 1e9),
        "load_duration": int(load_s * 1e9),
        "prompt_eval_count": num_tokens,
    }


async def serve_ollama_embeddings(body: OllamaEmbeddingsRequest, request: Request) -> Any:
    """The older endpoint: one `prompt`, one `embedding`; too long is refused."""
    body.log_unknown("ollama.embeddings")
    served = kept_model(request, body.model, body.keep_alive)
    limit = _limit(served, body.model, body.options)
    if not body.prompt:
        apply_keep_alive(served, body.keep_alive)
        return {"embedding": []}
    result = await _vectors(request, served, [body.prompt], limit, False, body.keep_alive)
    (vector,), _ = result
    return {"embedding": vector.astype("<f4", copy=False).tolist()}
