"""A stream's lane: the engine thread writes a plain token's event to the client itself.

Each streamed token handed to the event loop wakes it and passes the GIL twice; on two
cores that llama.cpp's threads fill, that costs more a token than the token's own bytes
(docs/benchmarks.md, "A token's lane"). A stream whose event for a piece of plain text
is fixed by the text alone opens a `TextLane` once its first token is out; the engine
thread then offers it each output (engine/thread/lanes.py) and it writes what it can
straight to the connection's socket. What it declines (the finish, logprobs, anything
while the loop has a send of its own pending) goes through the loop as always.

Every byte of a response still goes out in order:
- the lane writes only while asyncio's transport has nothing buffered, and the engine
  offers it an output only once the reader has sent every output handed to it before
  (`engine.lane.Lane`);
- the stream's own sends (events, heartbeats, proxy pings) and the lane's writes take
  the wire's lock, so they never interleave;
- the wire is closed (under that lock) before the response's end, and when the client
  leaves: the socket is the lane's own duplicate, so a descriptor the loop has closed
  and reused is never written to.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from engine.client import SeqOutput

# In the ASGI scope of a request served by our uvicorn protocol: the connection's asyncio
# transport (server/process/connections.py). Absent elsewhere (a test's ASGI client): no lane.
TRANSPORT_KEY = "kvserve.transport"


class Wire:
    """The client's connection, as a stream's lane writes to it from the engine thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._fd = -1
        self._transport: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._spilled = False

    @property
    def bound(self) -> bool:
        return self._fd >= 0

    def bind(self, scope: Mapping[str, Any]) -> None:
        """On the loop, once the response has started. Only a plain HTTP/1.1 connection:
        its body goes out in chunks, which `write` frames as uvicorn's h11 would."""
        transport = scope.get(TRANSPORT_KEY)
        if transport is None or scope.get("http_version") != "1.1":
            return
        sock = transport.get_extra_info("socket")
        if sock is None or transport.get_extra_info("sslcontext") is not None:
            return
        try:  # a client gone before the response started has no socket left (EBADF)
            self._fd = os.dup(sock.fileno())
        except OSError:
            return
        self._transport, self._loop = transport, asyncio.get_running_loop()

    def write(self, body: bytes) -> bool:
        """Engine thread, holding `lock`: one chunk of the body, sent now, or False."""
        transport = self._transport
        try:
            if self._fd < 0 or self._spilled or transport.is_closing() or (
                transport.get_write_buffer_size()
            ):
                return False
        except RuntimeError:  # the loop changed the buffer as it was measured
            return False
        frame = b"%x\r\n%b\r\n" % (len(body), body)
        try:
            sent = os.write(self._fd, frame)
        except OSError:  # the socket is full, or the client gone: the loop finds out
            return False
        if sent < len(frame):  # the rest goes out through the loop, before anything later
            self._spilled = True
            assert self._loop is not None
            self._loop.call_soon_threadsafe(transport.write, frame[sent:])
        return True

    def close(self) -> None:
        with self.lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


class TextLane:
    """`engine.client.Lane` for a stream whose event for plain text is `encode(text)`.

    It writes an output that is text and nothing more. An output with no text yet (a
    character's first bytes) needs no event: it counts as written."""

    def __init__(self, wire: Wire, encode: Callable[[str], bytes]):
        self.wire, self.encode = wire, encode
        self.paid = 0  # set by the reader (engine.lane.Lane)

    def offer(self, output: SeqOutput) -> bool:
        if (
            output.finish_reason is not None
            or output.logprobs
            or output.prompt_logprobs
            or output.num_prompt_tokens
        ):
            return False
        if not output.text:
            return True
        if not self.wire.lock.acquire(blocking=False):  # the loop is sending
            return False
        try:
            return self.wire.write(self.encode(output.text))
        finally:
            self.wire.lock.release()
