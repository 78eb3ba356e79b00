"""Connections that hold descriptors and send nothing: bounded and timed out.

uvicorn (0.54, h11) keeps a connection that never sends a byte open forever, and
accepts connections until the process runs out of descriptors; asyncio then reports
every failed accept (EMFILE) through the loop's exception handler, a traceback each
time. Measured before this module (issue 9): 1,200 silent connections against a
1,100-descriptor limit stopped the server and wrote 178,003 EMFILE lines in ten seconds.

Here each connection must deliver a complete request head within `header_timeout_s`
of connecting, and every later head within `header_timeout_s` of its first byte (an
idle connection between requests is closed by uvicorn's keep-alive timeout), or it is
closed; a request's body is bounded by `BodyLimit` (server/http/bodies.py),
`body_timeout_s`; past `max_connections` open connections a new
one is closed at once (its descriptor is freed, the server stays responsive to the
ones it holds); and the accept-failure report is logged at most once per
`LOG_EVERY_S`, with a count of those suppressed.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from typing import Any, cast

from uvicorn.protocols.http.h11_impl import H11Protocol

from server.serving.wire import TRANSPORT_KEY

log = logging.getLogger("kvserve.server")

LOG_EVERY_S = 10.0
# Descriptors kept back from max_connections when it is derived from the open-file
# limit: the model file, the disk tier's files, the log, pipes, the listening socket.
RESERVED_FDS = 64


def connection_limit(configured: int) -> int:
    """`configured`, or (0) the open-file limit less what the process needs besides."""
    if configured > 0:
        return configured
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 65536
    return max(16, soft - RESERVED_FDS)


def protocol_class(max_connections: int, header_timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a connection bound and a timeout on every request head."""

    class BoundedH11Protocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                transport.abort()  # over the bound: the descriptor goes back at once
                return
            self._arm_head_timer()  # the first head: within header_timeout_s of connecting

        def data_received(self, data: bytes) -> None:
            # A later head: within header_timeout_s of its first byte. uvicorn's keep-alive
            # timer stops at that byte, so before this a head sent a byte at a time (or
            # the unread rest of a refused body) held the connection for ever (issue 17).
            if self._head_timer is None and not self._request_in_progress():
                self._arm_head_timer()
            super().data_received(data)
            self._expose_transport()

        def on_response_complete(self) -> None:
            self._cancel_head_timer()  # idle now: uvicorn's keep-alive timeout applies
            super().on_response_complete()
            self._expose_transport()  # a pipelined request's head may have started one

        def _expose_transport(self) -> None:
            # The request's app task is created, not yet run: its scope gets the
            # transport, for a stream's lane (server/serving/wire.py).
            if self._request_in_progress():
                cast(dict[str, Any], self.cycle.scope).setdefault(TRANSPORT_KEY, self.transport)

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_head_timer()
            super().connection_lost(exc)

        def _request_in_progress(self) -> bool:
            # self.cycle is set when a request's head is complete, and stays after its
            # response; the request's body is BodyLimit's to bound.
            return self.cycle is not None and not self.cycle.response_complete

        def _arm_head_timer(self) -> None:
            self._head_timer = self.loop.call_later(header_timeout_s, self._head_timed_out)

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if not self._request_in_progress() and not self.transport.is_closing():
                self.transport.close()

    return BoundedH11Protocol


class AcceptErrorLog:
    """A loop exception handler that rate-limits asyncio's accept-failure reports (one
    per EMFILE retry, each with a traceback) and passes everything else on."""

    def __init__(self, clock: Any = time.monotonic):
        self._clock = clock
        self._last = -LOG_EVERY_S
        self.suppressed = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if "out of system resource" not in str(context.get("message", "")):
            loop.default_exception_handler(context)
            return
        now = self._clock()
        if now - self._last < LOG_EVERY_S:
            self.suppressed += 1
            return
        self._last = now
        log.error(
            "cannot accept connections: %s (%d such reports suppressed); raise the open-file"
            " limit or lower server.max_connections",
            context.get("exception"),
            self.suppressed,
        )
        self.suppressed = 0
