"""Tools, tool choice and the checks on them (plain values; the server parses JSON)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from chat.schema import SchemaError, check_schema


class ChatInputError(ValueError):
    """A request the chat layer cannot serve; `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param


# A tool whose input is free text in a grammar (the Responses API's `custom` tools) is
# shown to the model as a function with this one string parameter.
INPUT = "input"


@dataclass(frozen=True, slots=True)
class InputGrammar:
    """The grammar a custom tool's input must be a sentence of (its `format`)."""

    syntax: str  # "lark" or "regex" (chat/lark.py `tool_input_gbnf`)
    definition: str


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    parameters: Any  # a JSON schema (dict or bool)
    # Set: the tool takes one string, `INPUT`, and the call grammar holds it to this
    # grammar (`parameters` is then what the model is shown, a schema of that string).
    grammar: InputGrammar | None = None

    def as_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


@dataclass(frozen=True, slots=True)
class ToolChoice:
    mode: Literal["none", "auto", "required", "named"]
    name: str | None = None


class NamedChoice(Protocol):
    """A request's choice of one function, whatever its API calls the wrapper (None: an
    MCP choice naming only its server: one of that server's tools)."""

    @property
    def name(self) -> str | None: ...


def tool_choice(choice: Literal["none", "auto", "required"] | NamedChoice | None) -> ToolChoice:
    """An OpenAI-style `tool_choice`: "auto" when unset, a mode, or one named function."""
    if choice is None:
        return ToolChoice("auto")
    if isinstance(choice, str):
        return ToolChoice(choice)
    return ToolChoice("named", choice.name) if choice.name else ToolChoice("required")


def check_tools(tools: list[Tool], choice: ToolChoice) -> list[Tool]:
    """Validate tools and choice; return the tools the grammar may call."""
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if (
            not tool.name
            or len(tool.name) > 64
            or not all(c.isalnum() or c in "_-" for c in tool.name)
        ):
            raise ChatInputError(
                "a function name must be 1-64 characters of a-z, A-Z, 0-9, _ and -",
                param=f"tools[{i}].function.name",
            )
        if tool.name in seen:
            raise ChatInputError(
                f"duplicate tool name '{tool.name}'", param=f"tools[{i}].function.name"
            )
        seen.add(tool.name)
        try:
            check_schema(tool.parameters)
        except SchemaError as exc:
            raise ChatInputError(str(exc), param=f"tools[{i}].function.parameters") from None
    if choice.mode in ("required", "named") and not tools:
        raise ChatInputError(
            f"tool_choice '{choice.mode if choice.mode != 'named' else choice.name}' needs 'tools'",
            param="tool_choice",
        )
    if choice.mode == "named":
        chosen = [t for t in tools if t.name == choice.name]
        if not chosen:
            raise ChatInputError(
                f"tool_choice names '{choice.name}', which is not among the tools",
                param="tool_choice",
            )
        return chosen
    return tools


def parse_arguments(text: str, param: str) -> Any:
    """The JSON value of an assistant message's tool-call arguments string."""
    try:
        return json.loads(text)
    except ValueError:
        raise ChatInputError("tool call arguments must be a JSON string", param=param) from None
