"""Feed an output parser a text whole or in pieces; collect what it releases: the
message (content, reasoning_content, tool_calls), or the calls' raw argument text."""

from __future__ import annotations

import json
from typing import Any, Protocol

from chat.callformat import CallParser
from chat.callstream import Delta
from chat.plan import OutputParser


class Parser(Protocol):
    def feed(self, text: str) -> list[Delta]: ...

    def finish(self) -> list[Delta]: ...


def deltas(parser: Parser, text: str, step: int) -> list[Delta]:
    """All `parser` releases of `text` fed `step` characters at a time, and at its end."""
    out: list[Delta] = []
    for i in range(0, len(text), step):
        out += parser.feed(text[i : i + step])
    return out + parser.finish()


def raw_calls(released: list[Delta]) -> list[tuple[str, str]]:
    """Each call's name and arguments text; the calls' deltas must come keyed by index, in
    order, each call with an id."""
    calls: list[list[str]] = []
    for d in released:
        if d.kind == "start":
            # kvserve's own id, or the one the model sampled (Mistral Small 3.2's 9 characters)
            assert d.index == len(calls) and (d.call_id.startswith("call_") or (
                len(d.call_id) == 9 and d.call_id.isalnum()))  # fmt: skip
            calls.append([d.text, ""])
        elif d.kind == "args":
            calls[d.index][1] += d.text
    return [(name, args) for name, args in calls]


def run(parser: Parser, text: str, step: int) -> dict[str, Any]:
    """content, reasoning_content and tool_calls (name, arguments as JSON values) of a
    plan's whole output parser (the reasoning split included)."""
    released = deltas(parser, text, step)
    return {
        "content": "".join(d.text for d in released if d.kind == "content"),
        "reasoning_content": "".join(d.text for d in released if d.kind == "reasoning"),
        "tool_calls": [(name, json.loads(args)) for name, args in raw_calls(released)],
    }


def parse(tools: CallParser, text: str, step: int) -> dict[str, Any]:
    """`run` for a bare call parser, as OutputParser releases its deltas."""
    return run(OutputParser(None, tools), text, step)
