"""OpenAI Chat Completions' request model: messages, tools, tool_choice,
response_format, and the rules that tie them together (checked as the request is parsed)."""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

from pydantic import Field

from chat.reasoning import EFFORTS
from server.api.common import (
    FunctionDef,
    McpToolChoice,
    RequestModel,
    SamplingExtras,
)
from server.api.constraints import ConstraintFields
from server.errors import BadRequest, Unsupported

log = logging.getLogger("kvserve.server")


class ContentPart(RequestModel):
    """A text part, or an image part (`image_url`: {"url": a data: or http(s) URL,
    "detail": a hint}; read by server/api/chat/input.py)."""

    type: str
    text: str | None = None
    image_url: Any = None


class FunctionCall(RequestModel):
    name: str
    arguments: str


class ToolCall(RequestModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(RequestModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class ToolDef(RequestModel):
    type: str
    function: FunctionDef | None = None  # required for "function"; an "mcp" entry has none


class NamedFunction(RequestModel):
    name: str


class NamedToolChoice(RequestModel):
    type: Literal["function"]
    function: NamedFunction

    @property
    def name(self) -> str:  # the Responses API's flat spelling, for chat.tools.tool_choice
        return self.function.name


class JsonSchemaFormat(RequestModel):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | bool = Field(default=True, alias="schema")
    strict: bool | None = None


# Defined by OpenAI for chat, not implemented here: refused when set. (`metadata`
# labels a stored completion; nothing is stored without `store`, which is refused, so
# it is a hint, accepted and logged with the other unknown fields: opencode and the AI
# SDK send it.)
CHAT_UNSUPPORTED = (
    "functions",
    "function_call",
    "audio",
    "prediction",
    "web_search_options",
)


# Hints that change nothing here, accepted and logged as hints (not as unknown fields):
# `service_tier` picks a processing tier of OpenAI's (auto, default, flex, priority);
# kvserve has one, and answers every request on it.
CHAT_HINTS = ("service_tier",)


class ResponseFormat(RequestModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class ChatCompletionRequest(ConstraintFields, SamplingExtras):
    HINTS = CHAT_HINTS
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
    # OpenAI's: onto the template's thinking switches (chat/reasoning.py effort_kwargs)
    reasoning_effort: str | None = None
    # llama-server's thinking budget, under either of its names (-1: the server's
    # default); enforced by the engine (server/serving/thinking.py)
    reasoning_budget_tokens: Annotated[int, Field(ge=-1, le=2**31 - 1)] | None = None
    thinking_budget_tokens: Annotated[int, Field(ge=-1, le=2**31 - 1)] | None = None
    # llama-server's reply extras (server/serving/timings.py): the generated token ids in
    # each choice's `tokens`, and the `timings` object
    return_tokens: bool = False
    timings_per_token: bool = False

    @property
    def thinking_budget(self) -> int | None:
        """The budget this request names (server/serving/thinking.py enforces it)."""
        return request_budget(self.reasoning_budget_tokens, self.thinking_budget_tokens)

    @property
    def has_mcp(self) -> bool:
        """MCP tools (kvserve's extension): server/api/chat/mcp.py runs the turn."""
        return (any(t.type == "mcp" for t in self.tools or [])
                or isinstance(self.tool_choice, McpToolChoice))  # fmt: skip

    def refuse_unsupported(self) -> None:
        extra = self.model_extra or {}
        hints = sorted(name for name in CHAT_HINTS if extra.get(name) is not None)
        if hints:
            log.info("chat.completions: accepting hints that change nothing here: %s", hints)
        for name in CHAT_UNSUPPORTED:
            if extra.get(name) not in (None, [], {}):
                raise Unsupported(name, "not implemented yet")
        if extra.get("store") not in (None, False):
            raise Unsupported("store", "completions are never stored")
        modalities = extra.get("modalities")
        if modalities not in (None, ["text"]):
            raise Unsupported("modalities", "only ['text'] is available")
        if self.reasoning_effort is not None and self.reasoning_effort not in EFFORTS:
            raise BadRequest(
                f"unknown reasoning_effort '{self.reasoning_effort}'; one of {', '.join(EFFORTS)}",
                param="reasoning_effort",
            )
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
                    if part.type == "image_url" and message.role == "user":
                        continue  # read by input.py (server/serving/media.py)
                    if part.type == "image_url":
                        raise BadRequest("image parts belong in user messages",
                                         param=f"{where}.content[{j}].type")  # fmt: skip
                    if part.type != "text":
                        raise Unsupported(
                            f"{where}.content[{j}].type",
                            f"content parts of type '{part.type}' are not supported; only "
                            "'text' and 'image_url'",
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
            if tool.type == "mcp":  # kvserve's extension: server/api/chat/mcp.py reads it
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
        self.read_constraint(
            (("response_format", fmt != "text"), ("grammar", self.grammar is not None))
        )
        other = self.constraint
        if other is not None and other.schema is None and has_tools:
            raise BadRequest(
                f"'{other.param}' cannot be combined with tools (a JSON schema "
                "can: it is the answer's format beside the calls)",
                param=other.param,
            )

    def record_grammar(self) -> str | None:
        """A JSON constraint is this request's response format (chat_options says so, and
        the chat plan builds its grammar, with tools the document beside the calls)."""
        other = self.constraint
        if other is None or other.schema is not None:
            return self.grammar
        return other.gbnf


def request_budget(*values: int | None) -> int | None:
    """The first budget a request names (-1: the server's default, as llama-server)."""
    value = next((v for v in values if v is not None), None)
    return None if value == -1 else value
