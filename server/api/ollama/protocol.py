"""Ollama's request models (`/api/chat`, `/api/generate`, `/api/embed`, `/api/embeddings`,
`/api/show`), with Ollama's defaults (`stream` true, `truncate` true for embeddings).

Unknown fields are accepted and logged, as on every route; the fields Ollama defines
that kvserve does not implement are refused by name (`refuse_unsupported`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StrictInt

from chat.reasoning import OLLAMA_THINK_LEVELS
from engine.client import SamplingParams
from server.api.common import (
    FunctionDef,
    Penalty,
    Probability,
    RequestModel,
    StopText,
    stop_strings,
)
from server.errors import BadRequest, Unsupported
from server.models.keep_alive import KeepAlive
from server.serving.engine_requests import RequestSampling, sampler_settings

Name = Annotated[str, Field(min_length=1)]


class OllamaFunctionCall(RequestModel):
    name: Name
    arguments: dict[str, Any] = Field(default_factory=dict)  # an object, as Ollama sends it


class OllamaToolCall(RequestModel):
    id: str | None = None
    function: OllamaFunctionCall


class OllamaMessage(RequestModel):
    role: str
    content: str = ""
    thinking: str | None = None
    images: list[Any] | None = None
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: str | None = None


class OllamaTool(RequestModel):
    type: str = "function"
    function: FunctionDef


# Ollama's options that kvserve does not implement, and why.
REFUSED_OPTIONS = {
    **dict.fromkeys(("num_batch", "num_gpu", "main_gpu", "num_thread", "use_mmap",
                     "use_mlock", "numa", "low_vram", "f16_kv", "vocab_only", "logits_all",
                     "embedding_only"),  # fmt: skip
                    "a load-time setting; it is set in the server's configuration"),
    "num_keep": "kvserve does not shift the context (a prompt that does not fit is refused)",
    "tfs_z": "tail-free sampling is not in llama.cpp's sampler any more",
    "penalize_newline": "llama.cpp's sampler no longer has it",
}


class OllamaOptions(RequestModel):
    """Ollama's `options`, under Ollama's names and with Ollama's defaults where they
    differ from the engine's (its api.DefaultOptions); a validation error names
    `options.<field>` as Ollama spells it. Every option Ollama defines is either here or
    refused by name (REFUSED_OPTIONS); so is any name Ollama does not define. Integers
    are strict, as Go's decoder reads them (1.5 and true are not counts)."""

    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 0.8
    top_k: Annotated[int, Field(ge=0)] = 40
    top_p: Probability = 0.9
    min_p: Probability | None = None
    typical_p: Probability | None = None
    repeat_penalty: Annotated[float, Field(gt=0.0, le=10.0)] = 1.1
    repeat_last_n: Annotated[int, Field(ge=-1)] = 64
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    mirostat: Literal[0, 1, 2] | None = None
    mirostat_tau: Annotated[float, Field(ge=0.0)] | None = None
    mirostat_eta: Annotated[float, Field(ge=0.0)] | None = None
    stop: StopText | Annotated[list[StopText], Field(max_length=16)] | None = None
    seed: StrictInt | None = None  # negative: a random seed, as Ollama draws one
    num_predict: StrictInt | None = None  # -1: no limit; -2: fill the context
    num_ctx: StrictInt | None = None  # checked against the model's context by the route

    def refuse_unsupported(self) -> None:
        for name in self.model_extra or {}:
            if name in REFUSED_OPTIONS:
                raise Unsupported(f"options.{name}", REFUSED_OPTIONS[name])
            raise BadRequest(f"unknown option 'options.{name}'", param=f"options.{name}")
        if self.num_predict is not None and self.num_predict < -2:
            raise BadRequest("'options.num_predict' must be -1 (no limit), -2 (fill the "
                             "context) or a count", param="options.num_predict")  # fmt: skip

    def to_sampling_params(self) -> SamplingParams:
        names = ("temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty",
                 "repeat_last_n", "presence_penalty", "frequency_penalty", "mirostat",
                 "mirostat_tau", "mirostat_eta")  # fmt: skip
        seed = self.seed if self.seed is not None and self.seed >= 0 else None
        return sampler_settings({**{n: getattr(self, n) for n in names}, "seed": seed})

    def sampling_record(self) -> RequestSampling:
        return RequestSampling(self.to_sampling_params(), stop=stop_strings(self.stop))

    @property
    def max_tokens(self) -> int | None:
        """num_predict as a limit: 0 and negative counts mean none (the context bounds
        the answer), as in Ollama."""
        return self.num_predict if self.num_predict is not None and self.num_predict > 0 else None


class _Base(RequestModel):
    model: Name
    keep_alive: KeepAlive = None  # seconds (inf: for ever), parsed from Ollama's forms
    options: OllamaOptions = Field(default_factory=OllamaOptions)


class _Generating(_Base):
    stream: bool = True
    format: str | dict[str, Any] | None = None
    think: bool | str | None = None
    images: list[Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    shift: bool | None = None
    debug_render_only: bool | None = None

    def refuse_common(self) -> None:
        if self.logprobs or self.top_logprobs is not None:
            name = "logprobs" if self.logprobs else "top_logprobs"
            raise Unsupported(name, "log probabilities are on the OpenAI routes only")
        if self.shift:
            raise Unsupported("shift", "kvserve does not shift the context")
        if self.debug_render_only:
            raise Unsupported("debug_render_only")
        if isinstance(self.think, str) and self.think not in OLLAMA_THINK_LEVELS:
            raise BadRequest(f"'think' must be true, false or one of "
                             f"{', '.join(OLLAMA_THINK_LEVELS)}", param="think")  # fmt: skip
        if isinstance(self.format, str) and self.format not in ("", "json"):
            raise BadRequest("'format' must be \"json\" or a JSON schema", param="format")

    @property
    def response_format(self) -> str:
        if not self.format:
            return "text"
        return "json_object" if self.format == "json" else "json_schema"


class OllamaChatRequest(_Generating):
    messages: list[OllamaMessage] = Field(default_factory=list)
    tools: list[OllamaTool] | None = None
    truncate: bool | None = None  # true: drop the oldest turns to fit; false: refuse

    def refuse_unsupported(self) -> None:
        self.refuse_common()
        if self.images:  # /api/generate's field: on /api/chat each message has its own
            raise BadRequest("images go on a message on /api/chat ('messages[i].images')",
                             param="images")  # fmt: skip
        for i, message in enumerate(self.messages):
            where = f"messages[{i}]"
            if message.role not in ("system", "user", "assistant", "tool"):
                raise BadRequest(f"'{where}.role' must be system, user, assistant or tool",
                                 param=f"{where}.role")  # fmt: skip
            if message.tool_calls and message.role != "assistant":
                raise BadRequest("only assistant messages have tool_calls",
                                 param=f"{where}.tool_calls")  # fmt: skip
        for i, tool in enumerate(self.tools or []):
            if tool.type != "function":
                raise BadRequest(f"unknown tool type '{tool.type}'; only 'function'",
                                 param=f"tools[{i}].type")  # fmt: skip


class OllamaGenerateRequest(_Generating):
    prompt: str = ""
    suffix: str = ""
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool = False
    truncate: bool | None = None
    width: int | None = None
    height: int | None = None
    steps: int | None = None

    def refuse_unsupported(self) -> None:
        self.refuse_common()
        if self.template:
            raise Unsupported("template", "Ollama's Go templates are not rendered; the "
                              "model's own chat template applies (or use raw)")  # fmt: skip
        if self.truncate:
            raise Unsupported("truncate", "a prompt that does not fit is refused, not cut")
        for name in ("width", "height", "steps"):
            if getattr(self, name) is not None:
                raise Unsupported(name, "image generation is not available")
        if self.raw and self.system:
            raise BadRequest("'system' has no place in a raw prompt", param="system")
        if self.raw and self.context:
            raise BadRequest("'context' continues a templated conversation; a raw prompt "
                             "carries its own history", param="context")  # fmt: skip


class OllamaEmbedRequest(_Base):
    input: str | list[str] = ""
    truncate: bool = True
    dimensions: Annotated[int, Field(ge=1)] | None = None


class OllamaEmbeddingsRequest(_Base):
    prompt: str = ""


class OllamaShowRequest(RequestModel):
    model: str | None = None
    name: str | None = None  # the older spelling
    verbose: bool = False

    @property
    def model_name(self) -> str:
        name = self.model or self.name
        if not name:
            raise BadRequest("'model' is required", param="model")
        return name
