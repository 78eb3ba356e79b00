"""A request's sampling -> its engine requests: the one conversion from a protocol model
to the engine.

`sampler_settings`: a protocol model hands it its fields under the engine's own names
(`SAMPLER_FIELDS`), so a sampling option is declared once on the server side
(server/api/common.py `SamplingExtras`) and reaches the sampler without a mapping table
in between. The protocol model builds its `RequestSampling` once (`to_sampling_params()`):
the engine's `SamplingParams` and the fields that shape the engine requests rather than
the sampler (`n`, `stop`, the session, the salt, adapters). pydantic stops at the protocol
models: the serving core reads this record, never a request model.

`generate_requests`: that record and a prompt -> the engine requests (GenerateRequest),
each built once with everything it runs with: the final `max_tokens`, the server's
grammar, the thinking block, the images, the adapters its `lora` field names.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace

from engine.client import (
    GenerateRequest,
    Media,
    ModelInfo,
    SamplingParams,
    SessionPool,
    ThinkingSpec,
)
from server.errors import BadRequest
from server.http.deps import Caller

# The sampler settings a request may set under the engine's own names. The grammar
# triggers are the server's (a tool's grammar), never a client's.
SAMPLER_FIELDS = frozenset(
    f.name for f in fields(SamplingParams) if not f.name.startswith("grammar_")
)


def sampler_settings(values: Mapping[str, object]) -> SamplingParams:
    """SamplingParams from a request's fields (engine names; None: the engine's default).
    `logit_bias` keys are token ids sent as JSON object keys (text): a key that is not
    a number is a 400 naming the field. Whether each id is in the vocabulary is the
    engine's rule (engine/loop/validation.py), checked with every other limit of the model.
    Seeds are folded to the sampler's 32 bits (-1 and 2**32 - 1 are one seed)."""
    settings: dict[str, object] = {}
    for name, value in values.items():
        if name not in SAMPLER_FIELDS:
            raise TypeError(f"{name} is not a sampler setting")  # a programming error
        if value is None:
            continue
        if name == "logit_bias":
            value = tuple(_logit_bias(value))  # type: ignore[arg-type]
        elif name == "seed":
            value = int(value) & 0xFFFFFFFF  # type: ignore[call-overload]
        elif isinstance(value, list):
            value = tuple(value)
        settings[name] = value
    # OpenAI's default temperature is 1.0, as is the engine's.
    return SamplingParams(**settings)  # type: ignore[arg-type]


def _logit_bias(raw: Mapping[str, float]) -> list[tuple[int, float]]:
    out = []
    for key, bias in raw.items():
        try:
            token = int(key)
        except ValueError:
            raise BadRequest(
                f"logit_bias keys must be token ids; got {key!r}", param="logit_bias"
            ) from None
        out.append((token, float(bias)))
    return out


@dataclass(frozen=True, slots=True)
class RequestSampling:
    params: SamplingParams = field(default_factory=SamplingParams)
    n: int = 1
    stop: tuple[str, ...] = ()
    session_id: str | None = None
    session_pool: SessionPool = SessionPool.NAMED  # where a new session is created
    cache_salt: str | None = None
    lora: tuple[tuple[str | int, float], ...] | None = None  # (id or index, scale)
    speculative: bool | None = None  # None: the model's default


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
