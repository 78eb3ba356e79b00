"""A request's sampling fields as a plain frozen record: what every API asks of the sampler.

Each protocol model builds one from its own (already validated) fields, so pydantic
stops at the adapter: server/http/sampling.py and the serving core read this record, never
a request model. Unset fields are None and keep the engine's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestSampling:
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    typical_p: float | None = None
    min_keep: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None
    dry_sequence_breakers: tuple[str, ...] | None = None
    xtc_probability: float | None = None
    xtc_threshold: float | None = None
    top_n_sigma: float | None = None
    dynatemp_range: float | None = None
    dynatemp_exponent: float | None = None
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    ignore_eos: bool | None = None
    grammar: str | None = None
    logit_bias: tuple[tuple[str, float], ...] = ()  # (key as sent, bias)
    seed: int | None = None
    n: int = 1
    stop: tuple[str, ...] = ()
    session_id: str | None = None
    cache_salt: str | None = None
    lora: tuple[tuple[str | int, float], ...] | None = None  # (id or index, scale)
    speculative: bool | None = None
