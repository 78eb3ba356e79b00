"""One accumulator of parsed output: the text, the reasoning and the tool calls a parser
has produced so far, whatever API shapes them afterwards.

Every API reads its answer from here instead of re-assembling `Delta`s by hand: a
plain request feeds everything at once and reads the totals; a stream feeds each
increment and reads the call whose arguments it has to close.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from chat.callstream import Delta


@dataclass(slots=True)
class ParsedCall:
    """One tool call: `index` is its place among the choice's calls (the parser's)."""

    index: int
    call_id: str
    name: str
    arguments: str = ""  # the arguments' JSON text, as generated


@dataclass(slots=True)
class ParsedOutput:
    """What one choice said: content, reasoning and calls in the order they started."""

    _content: list[str] = field(default_factory=list)
    _reasoning: list[str] = field(default_factory=list)
    _calls: dict[int, ParsedCall] = field(default_factory=dict)

    def add(self, deltas: list[Delta]) -> None:
        for d in deltas:
            if d.kind == "content":
                self._content.append(d.text)
            elif d.kind == "reasoning":
                self._reasoning.append(d.text)
            elif d.kind == "start":
                self._calls[d.index] = ParsedCall(d.index, d.call_id, d.text)
            elif d.index in self._calls:  # a parser starts a call before its arguments
                self._calls[d.index].arguments += d.text

    @property
    def content(self) -> str:
        return "".join(self._content)

    @property
    def reasoning(self) -> str:
        return "".join(self._reasoning)

    @property
    def calls(self) -> list[ParsedCall]:
        return list(self._calls.values())

    def call(self, index: int) -> ParsedCall:
        return self._calls[index]


def parsed(deltas: list[Delta]) -> ParsedOutput:
    """The accumulator fed with `deltas` at once (a plain request's whole output)."""
    out = ParsedOutput()
    out.add(deltas)
    return out


def openai_calls(calls: list[ParsedCall]) -> list[dict[str, Any]]:
    """Calls in OpenAI chat's `tool_calls` shape (chat completions and its MCP turn)."""
    return [
        {"id": c.call_id, "type": "function",
         "function": {"name": c.name, "arguments": c.arguments}}
        for c in calls
    ]  # fmt: skip
