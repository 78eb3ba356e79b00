"""A request's sampling record -> engine values (SamplingParams, GenerateRequest), its
`lora` field included."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace

from engine.client import GenerateRequest, ModelInfo, SamplingParams
from server.http.deps import Caller
from server.http.errors import BadRequest
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
                tenant=caller.tenant,
                cache_salt=caller.salt(body.cache_salt),
                lora=lora,
                speculative=body.speculative,
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
