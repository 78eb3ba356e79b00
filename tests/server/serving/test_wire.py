"""A stream's lane on the server's side (server/serving/wire.py), over a real socket and
asyncio transport: the chunk framing, every case where the lane must leave an output to
the event loop, the order kept when the socket takes only part of a write, and the
stream's response binding and closing the wire."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator
from typing import Any

from engine.client import FinishReason, SeqOutput, TokenLogprob
from server.serving import sse
from server.serving.wire import TRANSPORT_KEY, TextLane, Wire


async def connection() -> tuple[asyncio.Transport, socket.socket]:
    """Our end as an asyncio transport, and the client's end as a blocking socket."""
    ours, theirs = socket.socketpair()
    transport, _ = await asyncio.get_running_loop().connect_accepted_socket(
        asyncio.Protocol, ours
    )
    return transport, theirs


def scope_of(transport: asyncio.Transport, version: str = "1.1") -> dict[str, Any]:
    return {TRANSPORT_KEY: transport, "http_version": version}


def on_thread(fn: Any, *args: Any) -> Any:
    """Run `fn` on another thread, as the engine thread would, and return its result."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(fn(*args)))
    thread.start()
    thread.join(5)
    return result[0]


def written(wire: Wire, body: bytes) -> bool:
    with wire.lock:
        return wire.write(body)


def read_exactly(sock: socket.socket, n: int) -> bytes:
    sock.settimeout(5)
    data = b""
    while len(data) < n:
        data += sock.recv(n - len(data))
    return data


async def test_a_write_is_one_http_chunk_on_the_socket() -> None:
    transport, theirs = await connection()
    wire = Wire()
    wire.bind(scope_of(transport))
    assert wire.bound
    assert on_thread(written, wire, b"data: hi\n\n")
    assert read_exactly(theirs, 15) == b"a\r\ndata: hi\n\n\r\n"
    wire.close()
    assert not wire.bound and not written(wire, b"x")
    wire.close()  # twice is fine
    transport.close()
    theirs.close()


async def test_no_lane_without_a_plain_http_1_1_transport() -> None:
    transport, theirs = await connection()
    for scope in ({}, scope_of(transport, "1.0")):
        wire = Wire()
        wire.bind(scope)
        assert not wire.bound and not written(wire, b"x")
    transport.close()
    theirs.close()


async def test_a_connection_closed_before_the_response_started_gets_no_lane() -> None:
    transport, theirs = await connection()
    theirs.close()
    transport.abort()
    await asyncio.sleep(0)  # the transport lets go of its socket
    wire = Wire()
    wire.bind(scope_of(transport))
    assert not wire.bound and not written(wire, b"x")
    wire.close()


async def test_nothing_is_written_past_what_the_transport_has_buffered() -> None:
    transport, theirs = await connection()
    wire = Wire()
    wire.bind(scope_of(transport))
    while not transport.get_write_buffer_size():  # the client reads nothing
        transport.write(b"x" * 65536)
    assert not written(wire, b"late")
    transport.abort()
    theirs.close()
    await asyncio.sleep(0)
    assert not written(wire, b"late")  # closing
    wire.close()


async def test_a_partial_write_sends_its_rest_through_the_loop_before_anything_later() -> None:
    transport, theirs = await connection()
    transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    wire = Wire()
    wire.bind(scope_of(transport))
    body = b"y" * 1_000_000
    assert on_thread(written, wire, body)  # the socket took part of it
    assert wire._spilled and not on_thread(written, wire, b"later")  # the loop writes now
    frame = b"%x\r\n%b\r\n" % (len(body), body)
    reader = asyncio.ensure_future(asyncio.to_thread(read_exactly, theirs, len(frame)))
    assert await reader == frame
    wire.close()
    transport.close()
    theirs.close()


class Bound:
    """A TextLane on a wire to a socket pair; `sent()` is what the client got."""

    async def __aenter__(self) -> Bound:
        self.transport, self.theirs = await connection()
        self.wire = Wire()
        self.wire.bind(scope_of(self.transport))
        self.lane = TextLane(self.wire, lambda text: text.encode())
        return self

    def sent(self) -> bytes:
        self.theirs.setblocking(False)
        try:
            return self.theirs.recv(65536)
        except BlockingIOError:
            return b""

    async def __aexit__(self, *exc: object) -> None:
        self.wire.close()
        self.transport.close()
        self.theirs.close()


async def test_the_lane_writes_plain_text_and_leaves_everything_else() -> None:
    async with Bound() as b:
        assert on_thread(b.lane.offer, SeqOutput("a", (1,)))
        assert b.sent() == b"1\r\na\r\n"
        assert on_thread(b.lane.offer, SeqOutput("", (2,)))  # no text yet: nothing to send
        lp = TokenLogprob(3, -0.5, ())
        for declined in (
            SeqOutput("b", (3,), logprobs=(lp,)),
            SeqOutput("b", (3,), prompt_logprobs=(lp,)),
            SeqOutput("b", (3,), num_prompt_tokens=5),
            SeqOutput("", (), finish_reason=FinishReason.STOP),
        ):
            assert not on_thread(b.lane.offer, declined)
        assert b.sent() == b""


async def test_the_lane_leaves_an_output_to_the_loop_while_the_loop_sends() -> None:
    async with Bound() as b:
        with b.wire.lock:  # the loop is sending: the engine thread does not wait for it
            assert not on_thread(b.lane.offer, SeqOutput("a", (1,)))
        assert on_thread(b.lane.offer, SeqOutput("d", (4,)))
        assert b.sent() == b"1\r\nd\r\n"


async def test_the_stream_binds_its_wire_and_closes_it_before_the_body_ends() -> None:
    transport, theirs = await connection()
    wire = Wire()
    bound_during: list[bool] = []

    async def events() -> AsyncIterator[sse.Event]:
        bound_during.append(wire.bound)
        yield "one"

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        if message.get("more_body") is False:
            bound_during.append(wire.bound)
        sent.append(message)

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()
        return {}

    stream = sse.event_stream(events(), on_close=lambda: None, wire=wire)
    await stream(scope_of(transport), receive, send)
    assert bound_during == [True, False]
    assert [m.get("body") for m in sent[1:]] == [b"data: one\n\n", b""]
    transport.close()
    theirs.close()


async def test_a_stream_without_a_lane_never_binds() -> None:
    transport, theirs = await connection()

    async def events() -> AsyncIterator[sse.Event]:
        yield "one"

    async def send(message: dict[str, Any]) -> None:
        pass

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()
        return {}

    stream = sse.event_stream(events(), on_close=lambda: None)
    await stream(scope_of(transport), receive, send)
    assert not stream.wire.bound and not stream.binds
    transport.close()
    theirs.close()
