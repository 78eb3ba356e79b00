"""Server-sent events, framed the way each API frames them, in one place.

OpenAI's chat/completions streams are bare `data:` lines ending in `data: [DONE]`; the
Responses API and Anthropic's Messages name every event (`event: <type>`) and have no
[DONE]. A failure in the middle of a stream (the status line is long gone) is sent as
one last event carrying the API's own error body.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask

from server.errors import APIError

DONE = "[DONE]"

Event = str | ServerSentEvent


# How long a stream may stay silent before it sends a heartbeat. Agents drop a stream
# that sends no event past a watchdog (Claude Code and Codex: about 300 s) and retry it
# from scratch, and a cold prefill of their 15-20k-token prompts can take that long on a
# small CPU. Their watchdogs count events, not SSE comments, so the heartbeat is an event
# of the API's own (Anthropic's `ping`, `response.in_progress` again, a chat chunk with
# an empty delta), sent by the stream itself in its order (`drive.increments`), never
# after its last event. The SSE comment every 15 s is for proxies.
HEARTBEAT_S = 5.0


def event_stream(events: AsyncIterator[Event], on_close: Callable[[], None]) -> EventSourceResponse:
    """The SSE response. `on_close` runs after the stream in every case, also when the
    client left before the first event. A str is one data line; a ServerSentEvent may
    carry an event name."""
    return EventSourceResponse(events, sep="\n", ping=15, background=BackgroundTask(on_close))


def data(payload: dict[str, Any]) -> str:
    return json.dumps(payload, ensure_ascii=False)


def named(event: str, payload: dict[str, Any]) -> ServerSentEvent:
    """A named event whose data repeats the name as its `type` (Responses, Messages)."""
    return ServerSentEvent(data=json.dumps({"type": event, **payload}, ensure_ascii=False),
                           event=event, sep="\n")  # fmt: skip


def openai_error_tail(err: APIError) -> str:
    """The last event of a chat/completions stream that failed midway."""
    return json.dumps(err.body())


def anthropic_error_tail(err: APIError) -> ServerSentEvent:
    return ServerSentEvent(data=json.dumps(err.anthropic_body()), event="error", sep="\n")


def chunk_framing(
    obj: str, response_id: str, created: int, model: str, include_usage: bool
) -> tuple[str, str]:
    """The constant JSON before and after the "choices" of every OpenAI stream chunk, so
    that a chunk costs one json.dumps of its choices and nothing else."""
    head = json.dumps(
        {
            "id": response_id,
            "object": obj,
            "created": created,
            "model": model,
            "system_fingerprint": None,
        }
    )
    return head[:-1] + ',"choices":', (',"usage":null}' if include_usage else "}")
