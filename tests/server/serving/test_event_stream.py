"""The SSE response (server/serving/sse.py EventStream) driven as uvicorn drives it: its
frames and headers, and every way a stream ends (done, the client gone while waiting or
while sending, a send refused, a bug), each running the stream's clean-up once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from sse_starlette import ServerSentEvent

from server.serving import sse


class Client:
    """The ASGI side: records what is sent; `leave()` makes receive() say disconnect."""

    def __init__(self, refuse_after: int | None = None, stall_after: int | None = None):
        self.sent: list[dict] = []
        self.gone = asyncio.Event()
        self.refuse_after, self.stall_after = refuse_after, stall_after

    async def receive(self) -> dict:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        bodies = sum(m["type"] == "http.response.body" for m in self.sent)
        if message["type"] == "http.response.body":
            if self.refuse_after is not None and bodies >= self.refuse_after:
                raise OSError("client gone")  # as uvicorn answers a send after a disconnect
            if self.stall_after is not None and bodies >= self.stall_after:
                await asyncio.Event().wait()  # a client that reads nothing more
        self.sent.append(message)

    def leave(self) -> None:
        self.gone.set()

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")


class Events:
    """An event generator that notes how it ended."""

    def __init__(self, items: list, wait_after: int | None = None, fail_after: int | None = None):
        self.items, self.wait_after, self.fail_after = items, wait_after, fail_after
        self.closed = False
        self.closes = 0

    async def run(self) -> AsyncIterator[sse.Event]:
        try:
            for i, item in enumerate(self.items):
                if i == self.wait_after:
                    await asyncio.Event().wait()  # a long prefill: nothing comes
                if i == self.fail_after:
                    raise RuntimeError("a bug")
                yield item
        finally:
            self.closed = True

    def on_close(self) -> None:
        self.closes += 1


async def run(events: Events, client: Client, leave_after_s: float | None = None) -> None:
    response = sse.event_stream(events.run(), on_close=events.on_close)
    if leave_after_s is not None:
        asyncio.get_running_loop().call_later(leave_after_s, client.leave)
    scope = {"type": "http", "method": "POST"}
    await asyncio.wait_for(response(scope, client.receive, client.send), timeout=5)


async def test_frames_and_headers_are_sse_starlettes() -> None:
    named = sse.named("response.created", {"n": 1})
    items = ['{"a": 1}', "two\nlines", named, sse.DONE]
    events, client = Events(items), Client()
    await run(events, client)
    start = client.sent[0]
    assert start["type"] == "http.response.start" and start["status"] == 200
    headers = dict(start["headers"])
    assert headers[b"content-type"] == b"text/event-stream; charset=utf-8"
    assert headers[b"cache-control"] == b"no-store"
    assert headers[b"x-accel-buffering"] == b"no"
    expected = b"".join(ServerSentEvent(data=i, sep="\n").encode() if isinstance(i, str)
                        else i.encode() for i in items)  # fmt: skip
    assert client.body == expected
    assert client.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert events.closed and events.closes == 1


async def test_a_header_set_on_the_response_is_sent() -> None:
    events, client = Events(["x"]), Client()
    response = sse.event_stream(events.run(), on_close=events.on_close)
    response.headers["x-kvserve-dropped"] = "3"
    await response({"type": "http"}, client.receive, client.send)
    assert (b"x-kvserve-dropped", b"3") in client.sent[0]["headers"]


async def test_a_client_gone_during_a_long_wait_ends_the_stream_at_once() -> None:
    events, client = Events(["first", "never"], wait_after=1), Client()
    await run(events, client, leave_after_s=0.05)
    assert client.body == b"data: first\n\n"
    assert events.closed and events.closes == 1


async def test_a_client_gone_while_a_send_waits_closes_the_generator() -> None:
    # The generator is left at a yield (its event is being sent): aclose runs its finally.
    events, client = Events(["a", "b", "c"]), Client(stall_after=1)
    await run(events, client, leave_after_s=0.05)
    assert client.body == b"data: a\n\n"
    assert events.closed and events.closes == 1


async def test_a_refused_send_is_a_client_gone_not_an_error() -> None:
    events, client = Events(["a", "b", "c"]), Client(refuse_after=1)
    await run(events, client)
    assert client.body == b"data: a\n\n"
    assert events.closed and events.closes == 1


async def test_a_failing_generator_raises_after_the_clean_up() -> None:
    events, client = Events(["a", "b"], fail_after=1), Client()
    with pytest.raises(RuntimeError, match="a bug"):
        await run(events, client)
    assert events.closes == 1


async def test_a_silent_stream_sends_proxy_pings_between_events(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sse, "PING_S", 0.02)
    events, client = Events(["a", "b"], wait_after=1), Client()
    await run(events, client, leave_after_s=0.15)
    body = client.body
    assert body.startswith(b"data: a\n\n: ping - ")
    assert body.count(b": ping - ") >= 2 and body.endswith(b"\n\n")
    assert events.closes == 1
