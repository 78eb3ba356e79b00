"""Feed a whole plan's output parser (reasoning split included) a text whole or in
pieces; collect the message as tests/chat/parse_run.py does for a bare call parser."""

from __future__ import annotations

import json
from typing import Any

from chat.callstream import Delta
from chat.plan import OutputParser


def run(parser: OutputParser, text: str, step: int) -> dict[str, Any]:
    """content, reasoning_content and tool_calls (name, arguments as JSON values); the
    calls' deltas must come keyed by index, in order, each with a fresh id."""
    deltas: list[Delta] = []
    for i in range(0, len(text), step):
        deltas += parser.feed(text[i : i + step])
    deltas += parser.finish()
    calls: list[list[str]] = []
    for d in deltas:
        if d.kind == "start":
            assert d.index == len(calls) and d.call_id.startswith("call_")
            calls.append([d.text, ""])
        elif d.kind == "args":
            calls[d.index][1] += d.text
    return {
        "content": "".join(d.text for d in deltas if d.kind == "content"),
        "reasoning_content": "".join(d.text for d in deltas if d.kind == "reasoning"),
        "tool_calls": [(name, json.loads(args)) for name, args in calls],
    }
