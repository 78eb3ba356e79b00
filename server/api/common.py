"""The request models several APIs share: the base every request model derives from
(an explicit null is an absent field, unknown fields are kept and logged, the request's
own rules run as it is parsed), the sampling fields, the field types, and the pieces of
a tool both OpenAI shapes and Ollama's name. Each API's own request models are in its
package (`server/api/<api>/protocol.py`). Responses are built as plain dicts by each
API's serving code (they sit on the per-token path, where pydantic serialisation would
cost throughput).

Unknown fields are accepted and logged (clients send vendor extras all the time).
Fields OpenAI defines that kvserve does not implement are refused by `refuse_unsupported`,
run as the request is parsed, with a 400 that names them, never silently ignored.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from chat.tools import Tool
from engine.client import SamplingParams
from server.serving.engine_requests import SAMPLER_FIELDS, RequestSampling, sampler_settings

log = logging.getLogger("kvserve.server")

Probability = Annotated[float, Field(ge=0.0, le=1.0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
TokenId = Annotated[int, Field(ge=0)]
# Stop strings are matched against the tail of the text after every token: bounded, so
# that a request cannot make each token cost a scan of megabytes.
StopText = Annotated[str, Field(min_length=1, max_length=1000)]


class LoraRef(BaseModel):
    """One adapter of a request's `lora` field (llama-server's name): its configured id
    (or, as llama-server, its index) and scale; server/serving/engine_requests.py resolves them."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    id: Annotated[str, Field(min_length=1, max_length=256)] | Annotated[int, Field(ge=0)]
    scale: Annotated[float, Field(ge=-100.0, le=100.0)] = 1.0


def _has_lone_surrogate(value: Any) -> bool:
    """JSON may escape a lone UTF-16 surrogate ("\\ud800"), and Python's json decodes it
    (and UTF-8-encoded ones) into a str that cannot be encoded back to UTF-8: the
    tokenizer would fail on it. Iterative, so deep nesting cannot exhaust the stack."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


class RequestModel(BaseModel):
    # NaN and Infinity are JSON extensions Python accepts; no field of ours means them.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data: Any) -> Any:
        """An explicit null for a field means "not set", as OpenAI and its SDKs treat it:
        the field takes its default (a required field is then reported missing)."""
        if not isinstance(data, dict):
            return data
        names = set(cls.model_fields)
        names |= {f.alias for f in cls.model_fields.values() if f.alias}
        return {k: v for k, v in data.items() if v is not None or k not in names}

    @field_validator("*")
    @classmethod
    def _valid_unicode(cls, value: Any) -> Any:
        if _has_lone_surrogate(value):
            raise ValueError("text must be valid Unicode (it contains a lone surrogate)")
        return value

    @model_validator(mode="after")
    def _request_rules(self) -> Self:
        """The rules no field constraint states (unsupported fields, fields that go
        together), checked once, as the request is parsed. They raise the APIError that
        names the field, which pydantic passes through unchanged to the error handlers."""
        self.refuse_unsupported()
        return self

    def refuse_unsupported(self) -> None:
        """This model's own rules (see `_request_rules`); none by default."""

    # Fields the API defines that change nothing here: logged as hints by the model's
    # own rules, so not a second time as unknown.
    HINTS: ClassVar[tuple[str, ...]] = ()

    def log_unknown(self, where: str) -> None:
        unknown = sorted(set(self.model_extra or ()) - set(self.HINTS))
        if unknown:
            log.info("%s: ignoring unknown fields %s", where, unknown)


def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    """A `stop` field (one string or a list of them) as the engine takes it."""
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


class StreamOptions(RequestModel):
    include_usage: bool = False


class SamplingExtras(RequestModel):
    """Sampling fields shared by chat and completions, OpenAI's and llama.cpp's, each
    declared once: those named as SamplingParams names them reach the sampler by that
    name (`to_sampling_params`), the rest shape the engine requests (`sampling_record`)."""

    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Probability | None = None
    n: Annotated[int, Field(ge=1)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: StopText | Annotated[list[StopText], Field(max_length=16)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    seed: int | None = None
    user: str | None = None
    # kvserve: a sticky session (or the X-Kvserve-Session header) and a prefix-cache salt
    session_id: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    cache_salt: Annotated[str, Field(max_length=256)] | None = None
    lora: Annotated[list[LoraRef], Field(max_length=64)] | None = None  # LoRA adapters
    # kvserve: speculative decoding by prompt lookup (None: the model's default)
    speculative: bool | None = None
    # llama.cpp extras
    top_k: Annotated[int, Field(ge=0)] | None = None
    min_p: Probability | None = None
    typical_p: Probability | None = None
    min_keep: Annotated[int, Field(ge=0)] | None = None
    repeat_penalty: Annotated[float, Field(gt=0.0, le=10.0)] | None = None
    repeat_last_n: Annotated[int, Field(ge=-1)] | None = None
    dry_multiplier: Annotated[float, Field(ge=0.0)] | None = None
    dry_base: Annotated[float, Field(ge=1.0)] | None = None
    dry_allowed_length: Annotated[int, Field(ge=0)] | None = None
    dry_penalty_last_n: Annotated[int, Field(ge=-1)] | None = None
    dry_sequence_breakers: Annotated[list[StopText], Field(max_length=64)] | None = None
    xtc_probability: Probability | None = None
    xtc_threshold: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_n_sigma: float | None = None
    dynatemp_range: Annotated[float, Field(ge=0.0)] | None = None
    dynatemp_exponent: Annotated[float, Field(ge=0.0)] | None = None
    mirostat: Literal[0, 1, 2] | None = None
    mirostat_tau: Annotated[float, Field(ge=0.0)] | None = None
    mirostat_eta: Annotated[float, Field(ge=0.0)] | None = None
    ignore_eos: bool | None = None
    grammar: Annotated[str, Field(max_length=256 * 1024)] | None = None

    @property
    def stop_list(self) -> tuple[str, ...]:
        return stop_strings(self.stop)

    def record_grammar(self) -> str | None:
        """The grammar the sampler gets from the request's own fields: `grammar`, or
        another server's constraint field (server/api/constraints.py) where the API
        takes those."""
        return self.grammar

    def to_sampling_params(self) -> SamplingParams:
        """The sampler settings: every field named as the engine names it goes through
        by that name (so a new option is a field here and one in SamplingParams), the
        grammar from `record_grammar`."""
        values = {name: getattr(self, name) for name in _SAMPLER_NAMED}
        return sampler_settings({**values, "grammar": self.record_grammar()})

    def sampling_record(self) -> RequestSampling:
        """The sampling as the serving core reads it, converted once."""
        return RequestSampling(
            params=self.to_sampling_params(),
            n=self.n,
            stop=self.stop_list,
            session_id=self.session_id,
            cache_salt=self.cache_salt,
            lora=None if self.lora is None else tuple((r.id, r.scale) for r in self.lora),
            speculative=self.speculative,
        )


# The fields of SamplingExtras that are sampler settings under the engine's own names.
_SAMPLER_NAMED = tuple(sorted(set(SamplingExtras.model_fields) & SAMPLER_FIELDS))


class FunctionDef(RequestModel):
    name: str
    description: str = ""
    parameters: dict[str, Any] | bool | None = None
    strict: bool | None = None


class McpToolChoice(RequestModel):
    """`{"type": "mcp", "server_label", "name"}`: Responses' shape, also taken by chat."""

    type: Literal["mcp"]
    server_label: str
    name: str | None = None


# Non-empty throughout, as the schema says (token ids are range-checked per model).
Text = Annotated[str, Field(min_length=1)]
TokenIds = Annotated[list[int], Field(min_length=1)]
Prompt = (
    Text
    | Annotated[list[Text], Field(min_length=1)]
    | TokenIds
    | Annotated[list[TokenIds], Field(min_length=1)]
)




def function_tool(fn: FunctionDef) -> Tool:
    """A function tool for the chat layer (no `parameters`: it takes no arguments)."""
    parameters = {"type": "object", "properties": {}} if fn.parameters is None else fn.parameters
    return Tool(fn.name, fn.description, parameters)
