"""A request's sampling as the serving core reads it: the engine's `SamplingParams`, built
once by the protocol model (its `to_sampling_params()`), and the fields that shape the
engine requests rather than the sampler (`n`, `stop`, the session, the salt, adapters).

The conversion is one function, `sampler_settings`: a protocol model hands it its fields
under the engine's own names (`SAMPLER_FIELDS`), so a sampling option is declared once on
the server side (server/api/common.py `SamplingExtras`) and reaches the sampler without a
mapping table in between. pydantic stops at the protocol models: the serving core reads
this record, never a request model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from engine.client import SamplingParams, SessionPool
from server.errors import BadRequest

# The sampler settings a request may set under the engine's own names. The grammar
# triggers are the server's (a tool's grammar), never a client's.
SAMPLER_FIELDS = frozenset(
    f.name for f in fields(SamplingParams) if not f.name.startswith("grammar_")
)


def sampler_settings(values: Mapping[str, object]) -> SamplingParams:
    """SamplingParams from a request's fields (engine names; None: the engine's default).
    `logit_bias` keys are token ids sent as JSON object keys (text): a key that is not
    a number is a 400 naming the field. Whether each id is in the vocabulary is the
    engine's rule (engine/validation.py), checked with every other limit of the model.
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
