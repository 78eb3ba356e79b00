"""A request's sampling record -> engine values (SamplingParams, GenerateRequest)."""

from __future__ import annotations

import uuid
from dataclasses import replace

from engine.client import GenerateRequest, ModelInfo, SamplingParams
from server.http.deps import Caller
from server.http.errors import BadRequest
from server.models.lora import lora_set
from server.serving.request_sampling import RequestSampling

# Request field -> SamplingParams field, for the fields that map one to one.
_DIRECT = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "typical_p",
    "min_keep",
    "presence_penalty",
    "frequency_penalty",
    "repeat_penalty",
    "repeat_last_n",
    "dry_multiplier",
    "dry_base",
    "dry_allowed_length",
    "dry_penalty_last_n",
    "xtc_probability",
    "xtc_threshold",
    "top_n_sigma",
    "dynatemp_range",
    "dynatemp_exponent",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
    "ignore_eos",
    "grammar",
)


def sampling_params(body: RequestSampling, info: ModelInfo) -> SamplingParams:
    """Build the sampler settings of a request; unset fields keep the engine defaults."""
    values: dict[str, object] = {}
    for name in _DIRECT:
        value = getattr(body, name)
        if value is not None:
            values[name] = value
    # Penalty windows (-1: the whole context): none is longer than the context.
    for name in ("repeat_last_n", "dry_penalty_last_n"):
        window = getattr(body, name)
        if window is not None:
            values[name] = min(window, info.n_ctx)
    if body.dry_sequence_breakers is not None:
        values["dry_sequence_breakers"] = body.dry_sequence_breakers
    if body.logit_bias:
        values["logit_bias"] = tuple(_logit_bias(body.logit_bias))
    if body.seed is not None:
        values["seed"] = body.seed & 0xFFFFFFFF
    # OpenAI's default temperature is 1.0, as is the engine's.
    return SamplingParams(**values)  # type: ignore[arg-type]


def _logit_bias(raw: tuple[tuple[str, float], ...]) -> list[tuple[int, float]]:
    """The keys as token ids. Whether each id is in the vocabulary is the engine's rule
    (engine/validation.py), checked once, with every other limit of the model."""
    out = []
    for key, bias in raw:
        try:
            token = int(key)
        except ValueError:
            raise BadRequest(
                f"logit_bias keys must be token ids; got {key!r}", param="logit_bias"
            ) from None
        out.append((token, float(bias)))
    return out


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
) -> list[GenerateRequest]:
    """The `n` engine requests of one API request. Choice i samples with seed + i, so
    seeded choices differ from each other yet reproduce run after run. `overrides`:
    SamplingParams fields set by the server (a tool or response_format grammar)."""
    base = sampling_params(body, info)
    if overrides:
        base = replace(base, **overrides)  # type: ignore[arg-type]
    caller = caller or Caller("", None)
    session_id = body.session_id
    if caller.session_header is not None:
        if session_id is not None and session_id != caller.session_header:
            raise BadRequest(
                "session_id and the X-Session-Id header name different sessions",
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
                tenant=caller.tenant,
                cache_salt=caller.salt(body.cache_salt),
                lora=lora,
                speculative=body.speculative,
            )
        )
    return requests
