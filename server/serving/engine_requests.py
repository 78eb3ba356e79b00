"""A request's sampling record -> its engine requests (GenerateRequest), each built once
with everything it runs with: the final `max_tokens`, the server's grammar, the thinking
block, the images, the adapters its `lora` field names."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace

from engine.client import GenerateRequest, Media, ModelInfo, SamplingParams, ThinkingSpec
from server.errors import BadRequest
from server.http.deps import Caller
from server.serving.request_sampling import RequestSampling


def sampling_params(sampling: RequestSampling, info: ModelInfo) -> SamplingParams:
    """The request's sampler settings on this model: penalty windows (-1: the whole
    context) no longer than the context. A `replace` only where a window is past it."""
    params = sampling.params
    fitted = {name: info.n_ctx for name in ("repeat_last_n", "dry_penalty_last_n")
              if getattr(params, name) > info.n_ctx}  # fmt: skip
    return replace(params, **fitted) if fitted else params  # type: ignore[arg-type]


def generate_requests(
    prompt: list[int],
    body: RequestSampling,
    info: ModelInfo,
    *,
    max_tokens: int | None,
    logprobs: int | None,
    prompt_logprobs: int | None = None,
    caller: Caller | None = None,
    overrides: dict[str, object] | None = None,
    thinking: ThinkingSpec | None = None,
    media: tuple[Media, ...] = (),
) -> list[GenerateRequest]:
    """The `n` engine requests of one API request. Choice i samples with seed + i, so
    seeded choices differ from each other yet reproduce run after run. `overrides`:
    SamplingParams fields set by the server (a tool or response_format grammar);
    `thinking`: the thinking block (server/serving/thinking.py); `media`: the images
    `prompt` holds, in order."""
    base = sampling_params(body, info)
    if overrides:
        base = replace(base, **overrides)  # type: ignore[arg-type]
    caller = caller or Caller("", None)
    session_id = body.session_id
    if caller.session_header is not None:
        if session_id is not None and session_id != caller.session_header:
            raise BadRequest(
                "session_id and the session header name different sessions",
                param="session_id",
            )
        session_id = caller.session_header
    lora = lora_set(body.lora, info)
    requests = []
    for i in range(body.n):
        sampling = base
        if base.seed is not None and i > 0:
            sampling = replace(base, seed=(base.seed + i) & 0xFFFFFFFF)
        requests.append(
            GenerateRequest(
                request_id=uuid.uuid4().hex,
                prompt_tokens=tuple(prompt),
                sampling=sampling,
                max_tokens=max_tokens,
                stop=body.stop,
                logprobs=logprobs,
                prompt_logprobs=prompt_logprobs,
                session_id=session_id,
                session_pool=body.session_pool,
                tenant=caller.tenant,
                cache_salt=caller.salt(body.cache_salt),
                lora=lora,
                speculative=body.speculative,
                thinking=thinking,
                media=media,
            )
        )
    return requests


def lora_set(
    refs: Sequence[tuple[str | int, float]] | None, info: ModelInfo
) -> tuple[tuple[str, float], ...]:
    """The adapters a request runs with (its `lora` field against the model's configured
    adapters), as (id, scale) sorted by id, without zero scales.

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
