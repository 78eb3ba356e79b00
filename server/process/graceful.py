"""Stopping the app without losing work (server/process/serve.py starts it under uvicorn).

uvicorn's own SIGTERM handling closes the listening socket and waits for open
connections; sse-starlette, which patches uvicorn's signal handler, cancels every
stream at once, so a stream in flight would be cut mid-sentence. kvserve handles the
signal itself instead:

1. First SIGTERM (or SIGINT): drain. New requests get 503 `shutting_down` (and
   /health 503 `draining`, so a load balancer stops sending); in-flight requests
   may finish within `server.shutdown_grace_s`.
2. When the grace is over, what still runs is aborted: streams end with a final chunk
   and `[DONE]`, other requests answer with what they have.
3. Then uvicorn stops (socket closed, connections finished) and the lifespan closes
   every engine (`Engine.close`), and the process exits with status 0.

A second signal during the drain exits at once with status 1 (nothing is saved).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from types import FrameType

import uvicorn

from server.http.drain import Lifecycle
from server.process.connections import AcceptErrorLog

log = logging.getLogger("kvserve.server")


class GracefulServer(uvicorn.Server):
    """uvicorn.Server whose first signal drains the app before uvicorn stops."""

    def __init__(self, config: uvicorn.Config, lifecycle: Lifecycle, grace_s: float):
        super().__init__(config)
        self.lifecycle = lifecycle
        self.grace_s = grace_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._signalled = False
        self._drain_task: asyncio.Task[None] | None = None

    async def serve(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
        self._loop = asyncio.get_running_loop()
        self._loop.set_exception_handler(AcceptErrorLog())  # see server/process/connections.py
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Deliberately not uvicorn's (nor sse-starlette's patched) handler: see the module
        # docstring. Not recording the signal also keeps uvicorn from re-raising it at exit.
        if self._signalled:
            log.warning("second %s: exiting now", signal.Signals(sig).name)
            logging.shutdown()
            os._exit(1)
        self._signalled = True
        log.info("%s: shutting down", signal.Signals(sig).name)
        if self._loop is None or not self.started:
            self.should_exit = True
            return
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain_task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        try:
            await self.lifecycle.drain(self.grace_s)
        finally:
            self.should_exit = True
