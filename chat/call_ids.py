"""Past calls' ids as a template demands them.

Mistral's templates (Nemo, Small 3.2) raise "Tool call IDs should be alphanumeric
strings with length 9!" on any other id, and the ids clients send back are rarely that:
kvserve's own (`call_` + 24), Anthropic's `toolu_…`, Codex's and the agent frameworks'.
Such a conversation's second turn would be refused. On those templates each id is
rendered as 9 alphanumerics derived from it: the same id gives the same text on every
turn (the prompt's head stays the same, so its KV is reused), and a call and its result
still name each other. An id that already is 9 alphanumerics (the ids Mistral Small 3.2
samples) is left as it is.
"""

from __future__ import annotations

import hashlib
import re
import string
from typing import Any

_ALNUM = string.ascii_letters + string.digits
_NINE = re.compile(r"[A-Za-z0-9]{9}")
# The templates' own check, as they word it.
_DEMAND = "alphanumeric strings with length 9"


def demands_nine(template_source: str) -> bool:
    return _DEMAND in template_source


def nine(call_id: str) -> str:
    """`call_id` as 9 alphanumerics: itself if it is, else derived from its digest."""
    if _NINE.fullmatch(call_id):
        return call_id
    digest = hashlib.sha256(call_id.encode()).digest()
    return "".join(_ALNUM[b % len(_ALNUM)] for b in digest[:9])


def with_nine(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with every call id and tool_call_id as `nine` renders it."""
    out = []
    for message in messages:
        if message.get("tool_calls"):
            calls = [
                {**c, "id": nine(c["id"])} if c.get("id") else c for c in message["tool_calls"]
            ]
            message = {**message, "tool_calls": calls}
        if message.get("tool_call_id"):
            message = {**message, "tool_call_id": nine(message["tool_call_id"])}
        out.append(message)
    return out
