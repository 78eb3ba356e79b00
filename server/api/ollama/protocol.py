"""Ollama's request models (`/api/chat`, `/api/generate`, `/api/embed`, `/api/embeddings`,
`/api/show`), with Ollama's defaults (`stream` true, `truncate` true for embeddings).

Unknown fields are accepted and logged, as on every route; the fields Ollama defines
that kvserve does not implement are refused by name (`refuse_unsupported`).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from chat.reasoning import OLLAMA_THINK_LEVELS
from server.api.common import FunctionDef, RequestModel
from server.http.errors import BadRequest, Unsupported
from server.models.keep_alive import KeepAlive

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


class _Base(RequestModel):
    model: Name
    keep_alive: KeepAlive = None  # seconds (inf: for ever), parsed from Ollama's forms
    options: dict[str, Any] | None = None


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
