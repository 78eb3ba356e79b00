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

from server.http.errors import APIError

DONE = "[DONE]"

Event = str | ServerSentEvent


# How often a stream sends its heartbeat, whatever else it sends. Agents drop a stream
# that stays silent past a watchdog (Claude Code and Codex: about 300 s) and retry it
# from scratch, and a cold prefill of their 15-20k-token prompts can take that long on a
# small CPU. Their watchdogs count events, not SSE comments, so the heartbeat is an event
# of the API's own (Anthropic's `ping`, a repeated `response.in_progress`, an empty chat
# delta) where the stream has one; proxies that close idle connections are kept off too.
HEARTBEAT_S = 5


def event_stream(
    events: AsyncIterator[Event],
    on_close: Callable[[], None],
    heartbeat: Callable[[], ServerSentEvent] | None = None,
) -> EventSourceResponse:
    """The SSE response. `on_close` runs after the stream in every case, also when the
    client left before the first event. A str is one data line; a ServerSentEvent may
    carry an event name. `heartbeat` makes the event sent every HEARTBEAT_S seconds (by
    default an SSE comment)."""
    return EventSourceResponse(events, sep="\n", ping=HEARTBEAT_S,
                               ping_message_factory=heartbeat,
                               background=BackgroundTask(on_close))  # fmt: skip


def anthropic_ping() -> ServerSentEvent:
    return named("ping", {})


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


def chunk_heartbeat(head: str, tail: str) -> Callable[[], ServerSentEvent]:
    """A chat/completions stream's heartbeat: a chunk with an empty delta, which every
    client reads as "nothing new" (no content, no call, no finish)."""
    beat = head + '[{"index":0,"delta":{},"logprobs":null,"finish_reason":null}]' + tail
    return lambda: ServerSentEvent(data=beat, sep="\n")
