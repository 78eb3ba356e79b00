"""OpenAI wire models for requests. Responses are built as plain dicts in the routes
(they sit on the per-token path, where pydantic serialisation would cost throughput).

Unknown fields are accepted and logged (clients send vendor extras all the time).
Fields OpenAI defines that kvserve does not implement are refused by `refuse_unsupported`,
run as the request is parsed, with a 400 that names them, never silently ignored.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from server.errors import BadRequest, Unsupported
from server.lora import LoraField
from server.serving.request_sampling import RequestSampling

log = logging.getLogger("kvserve.server")

Probability = Annotated[float, Field(ge=0.0, le=1.0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
TokenId = Annotated[int, Field(ge=0)]
# Stop strings are matched against the tail of the text after every token: bounded, so
# that a request cannot make each token cost a scan of megabytes.
StopText = Annotated[str, Field(min_length=1, max_length=1000)]


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


class _Open(BaseModel):
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

    def log_unknown(self, where: str) -> None:
        if self.model_extra:
            log.info("%s: ignoring unknown fields %s", where, sorted(self.model_extra))


class StreamOptions(_Open):
    include_usage: bool = False


class SamplingExtras(_Open):
    """Sampling fields shared by chat and completions, OpenAI's and llama.cpp's."""

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
    # kvserve: a sticky session (or the X-Session-Id header) and a prefix-cache salt
    session_id: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    cache_salt: Annotated[str, Field(max_length=256)] | None = None
    lora: LoraField = None  # LoRA adapters and scales (see server/lora.py)
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
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def sampling_record(self) -> RequestSampling:
        """The sampler fields as the plain record the serving core reads."""
        fields = {name: getattr(self, name) for name in _RECORD_AS_IS}
        breakers = self.dry_sequence_breakers
        return RequestSampling(
            **fields,
            dry_sequence_breakers=None if breakers is None else tuple(breakers),
            logit_bias=tuple((self.logit_bias or {}).items()),
            stop=self.stop_list,
            lora=None if self.lora is None else tuple((r.id, r.scale) for r in self.lora),
        )


# The record's fields that SamplingExtras holds with the same name and type.
_RECORD_AS_IS = tuple(
    name for name in RequestSampling.__dataclass_fields__
    if name not in ("dry_sequence_breakers", "logit_bias", "stop", "lora")
)  # fmt: skip


class TextPart(_Open):
    type: str
    text: str | None = None


class FunctionCall(_Open):
    name: str
    arguments: str


class ToolCall(_Open):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class FunctionDef(_Open):
    name: str
    description: str = ""
    parameters: dict[str, Any] | bool | None = None
    strict: bool | None = None


class ToolDef(_Open):
    type: str
    function: FunctionDef | None = None  # required for "function"; an "mcp" entry has none


class McpToolChoice(_Open):
    """`{"type": "mcp", "server_label", "name"}`: Responses' shape, also taken by chat."""

    type: Literal["mcp"]
    server_label: str
    name: str | None = None


class NamedFunction(_Open):
    name: str


class NamedToolChoice(_Open):
    type: Literal["function"]
    function: NamedFunction

    @property
    def name(self) -> str:  # the Responses API's flat spelling, for chat.tools.tool_choice
        return self.function.name


class JsonSchemaFormat(_Open):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | bool = Field(default=True, alias="schema")
    strict: bool | None = None


# Defined by OpenAI for chat, not implemented here: refused when set.
CHAT_UNSUPPORTED = (
    "functions",
    "function_call",
    "audio",
    "prediction",
    "web_search_options",
    "reasoning_effort",
    "metadata",
)


class ResponseFormat(_Open):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class ChatCompletionRequest(SamplingExtras):
    model: str
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    response_format: ResponseFormat | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | McpToolChoice | None = None
    parallel_tool_calls: bool = True
    # llama.cpp's: "none" leaves thinking inline; "auto"/"deepseek" split it out.
    reasoning_format: Literal["auto", "deepseek", "none"] = "auto"

    def refuse_unsupported(self) -> None:
        extra = self.model_extra or {}
        for name in CHAT_UNSUPPORTED:
            if extra.get(name) not in (None, [], {}):
                raise Unsupported(name, "not implemented yet")
        if extra.get("store") not in (None, False):
            raise Unsupported("store", "completions are never stored")
        modalities = extra.get("modalities")
        if modalities not in (None, ["text"]):
            raise Unsupported("modalities", "only ['text'] is available")
        self._check_constraints()
        if self.top_logprobs is not None and not self.logprobs:
            raise BadRequest("'top_logprobs' requires 'logprobs' to be true", param="top_logprobs")
        for i, message in enumerate(self.messages):
            where = f"messages[{i}]"
            if message.role == "tool" and not message.tool_call_id:
                raise BadRequest(
                    "a tool message needs 'tool_call_id'", param=f"{where}.tool_call_id"
                )
            if message.tool_calls and message.role != "assistant":
                raise BadRequest(
                    "only assistant messages have tool_calls", param=f"{where}.tool_calls"
                )
            if isinstance(message.content, list):
                for j, part in enumerate(message.content):
                    if part.type != "text":
                        raise Unsupported(
                            f"{where}.content[{j}].type",
                            f"content parts of type '{part.type}' are not supported; only 'text'",
                        )
                    if part.text is None:
                        raise BadRequest(
                            "a text content part needs 'text'", param=f"{where}.content[{j}].text"
                        )
            elif message.content is None and message.role not in ("assistant", "tool"):
                raise BadRequest(f"{where}.content is required", param=f"{where}.content")

    def _check_constraints(self) -> None:
        """Tools, response_format and raw grammar: which may go together."""
        fmt = self.response_format.type if self.response_format else "text"
        if fmt == "json_schema" and (
            self.response_format is None or self.response_format.json_schema is None
        ):
            raise BadRequest(
                "response_format json_schema needs 'json_schema'",
                param="response_format.json_schema",
            )
        for i, tool in enumerate(self.tools or []):
            if tool.type == "mcp":  # kvserve's extension: apis/chat_mcp.py reads it
                continue
            if tool.type != "function":
                raise BadRequest(f"unknown tool type '{tool.type}'; only 'function' and 'mcp'",
                                 param=f"tools[{i}].type")  # fmt: skip
            if tool.function is None:
                raise BadRequest("a function tool needs 'function'", param=f"tools[{i}].function")
        has_tools = bool(self.tools) and self.tool_choice != "none"
        if self.grammar is not None and (has_tools or fmt != "text"):
            raise BadRequest(
                "'grammar' cannot be combined with tools or a JSON response_format",
                param="grammar",
            )


# Non-empty throughout, as the schema says (token ids are range-checked per model).
Text = Annotated[str, Field(min_length=1)]
TokenIds = Annotated[list[int], Field(min_length=1)]
Prompt = (
    Text
    | Annotated[list[Text], Field(min_length=1)]
    | TokenIds
    | Annotated[list[TokenIds], Field(min_length=1)]
)


class CompletionRequest(SamplingExtras):
    model: str
    prompt: Prompt
    max_tokens: Annotated[int, Field(ge=0)] | None = 16
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    echo: bool = False

    def refuse_unsupported(self) -> None:
        extra = self.model_extra or {}
        if extra.get("suffix") not in (None, ""):
            raise Unsupported("suffix", "insertion is not implemented")
        best_of = extra.get("best_of")
        if best_of is not None and best_of != self.n:
            raise Unsupported("best_of", "only best_of equal to n is available")
        if self.echo and self.logprobs is not None and self.stream:
            raise Unsupported("echo", "echo with logprobs is not implemented for streams yet")
        if self.max_tokens == 0 and not self.echo:
            raise BadRequest(
                "'max_tokens' must be at least 1 unless echo is true", param="max_tokens"
            )


class EmbeddingRequest(_Open):
    model: str
    input: Prompt
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
    user: str | None = None


class TokenizeRequest(_Open):
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(_Open):
    tokens: list[TokenId]
