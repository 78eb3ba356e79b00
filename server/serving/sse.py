"""Server-sent events, framed the way each API frames them, in one place.

OpenAI's chat/completions streams are bare `data:` lines ending in `data: [DONE]`; the
Responses API and Anthropic's Messages name every event (`event: <type>`) and have no
[DONE]. A failure in the middle of a stream (the status line is long gone) is sent as
one last event carrying the API's own error body.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from sse_starlette import ServerSentEvent
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from server.errors import APIError
from server.serving.wire import Wire

DONE = "[DONE]"

Event = str | ServerSentEvent


# How long a stream may stay silent before it sends a heartbeat. Agents drop a stream
# that sends no event past a watchdog (Claude Code and Codex: about 300 s) and retry it
# from scratch, and a cold prefill of their 15-20k-token prompts can take that long on a
# small CPU. Their watchdogs count events, not SSE comments, so the heartbeat is an event
# of the API's own (Anthropic's `ping`, `response.in_progress` again, a chat chunk with
# an empty delta), sent by the stream itself in its order (`drive.increments`), never
# after its last event. The SSE comment every PING_S is for proxies.
HEARTBEAT_S = 5.0
PING_S = 15.0


def event_stream(
    events: AsyncIterator[Event], on_close: Callable[[], None], wire: Wire | None = None
) -> EventStream:
    """The SSE response. `on_close` runs after the stream in every case, also when the
    client left before the first event. A str is one data line; a ServerSentEvent may
    carry an event name. `wire`: bound to the connection once the response starts, for
    a lane that writes some events from the engine thread (server/serving/wire.py)."""
    return EventStream(events, on_close, wire)


class EventStream(Response):
    """A stream of server-sent events, ended early when the client goes away.

    Ours rather than sse-starlette's EventSourceResponse, whose every send enters an
    anyio cancel scope (a timeout that is off): on a streamed token that was about a
    tenth of the event loop's CPU, and on a machine whose cores llama.cpp's threads
    fill, the loop's CPU comes out of the decode (docs/benchmarks.md, "What the server
    costs per token"). The same headers, framing and proxy pings; the stream runs in a
    task of its own beside one that waits for the client's disconnect, and whichever
    ends first cancels the other."""

    media_type = "text/event-stream"

    def __init__(
        self, events: AsyncIterator[Event], on_close: Callable[[], None], wire: Wire | None
    ):
        # Not Response.__init__: it would announce a body of 0 bytes (content-length).
        self.status_code, self.background = 200, None
        self.events, self.on_close = events, on_close
        self.binds, self.wire = wire is not None, wire or Wire()  # unbound: no lane
        self.init_headers({"cache-control": "no-store", "connection": "keep-alive",
                           "x-accel-buffering": "no"})  # fmt: skip

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        lock = asyncio.Lock()  # a ping never lands inside an event's send
        streaming = asyncio.ensure_future(self._stream(scope, send, lock))
        watching = asyncio.ensure_future(_until_disconnect(receive))
        pinging = asyncio.ensure_future(_ping(self._sender(send, lock)))
        try:
            await asyncio.wait((streaming, watching), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (streaming, watching, pinging):
                task.cancel()
            await asyncio.wait((streaming, watching, pinging))
            self.wire.close()
            aclose = getattr(self.events, "aclose", None)
            if aclose is not None:  # a generator left at a yield: its finally blocks run
                with contextlib.suppress(Exception):
                    await aclose()
            self.on_close()
        failed = None if streaming.cancelled() else streaming.exception()
        if failed is not None:
            raise failed  # a bug: the app's error handler logs it

    def _sender(self, send: Send, lock: asyncio.Lock) -> Callable[[bytes], Awaitable[None]]:
        """One part of the body, sent in turn with the rest: a ping never lands inside an
        event's send (`lock`), nor beside a write of the engine thread (the wire's)."""

        async def send_body(body: bytes) -> None:
            async with lock:
                with self.wire.lock:  # held by the engine thread only for one write
                    await send({"type": "http.response.body", "body": body, "more_body": True})

        return send_body

    async def _stream(self, scope: Scope, send: Send, lock: asyncio.Lock) -> None:
        async with lock:
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})  # fmt: skip
        if self.binds:
            self.wire.bind(scope)
        send_body = self._sender(send, lock)
        try:
            async for event in self.events:
                await send_body(encode(event))
            self.wire.close()  # the body's end goes last
            async with lock:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # the client is gone (ASGI 2.4 servers raise it on a send)
            return


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _ping(send_body: Callable[[bytes], Awaitable[None]]) -> None:
    """An SSE comment every PING_S: proxies drop a connection silent for long."""
    with contextlib.suppress(OSError):  # the client is gone: the stream sees it too
        while True:
            await asyncio.sleep(PING_S)
            await send_body(f": ping - {datetime.now(UTC)}\n\n".encode())


def encode(event: Event) -> bytes:
    """One event's bytes: a str is the data of an unnamed event."""
    if isinstance(event, str):
        if "\n" in event or "\r" in event:  # one data line a line, as SSE asks
            return ServerSentEvent(data=event, sep="\n").encode()
        return b"data: " + event.encode() + b"\n\n"
    return event.encode()


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
