"""Granite 3.3: a JSON list of calls after `<|tool_call|>`, which its template asks for
("respond only with <|tool_call|> followed by a JSON list of tools used") but never
renders: it writes a past turn's `content` alone, so a past call would vanish.

    <|tool_call|>[{"name": "get_time", "arguments": {"city": "Paris"}}]

llama.cpp has no call format for this template (its autoparser finds no calls in the
template's renders, so it parses content only; a `<think>` patch in
common/chat-diff-analyzer.cpp splits the thinking). kvserve speaks the syntax the
template names: the grammar and parser are the JSON family's (chat/formats.py `GRANITE`),
and a past turn's calls are written into its content in that syntax (`calls_as_content`),
so the model sees its own calls and a sampled call renders back as it was sampled.
"""

from __future__ import annotations

import json
from typing import Any

MARKER = "<|tool_call|>"


def detect_granite(source: str) -> bool:
    """The template that names `<|tool_call|>` and renders the tools as `available_tools`."""
    return MARKER in source and "available_tools" in source


def calls_as_content(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each assistant turn's calls appended to its content as `<|tool_call|>[...]`."""
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if message.get("role") != "assistant" or not calls:
            out.append(message)
            continue
        listed = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                  for c in calls]  # fmt: skip
        text = MARKER + json.dumps(listed, ensure_ascii=False)
        content = message.get("content") or ""
        rest = {k: v for k, v in message.items() if k != "tool_calls"}
        out.append({**rest, "content": content + text if isinstance(content, str) else text})
    return out
