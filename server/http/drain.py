"""The app's shutdown state (`Lifecycle`): whether it drains, and the requests in flight.

With the app's other request plumbing: the app makes it and its middleware
(server/http/middleware.py) gates and counts requests on it, while server/process/,
which runs the app (serve.py builds it, graceful.py drains it on a signal), sits above
the app and reaches it from there. Kept in process/, it made the app import the package
that imports the app (see server/process/graceful.py for the drain)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from server.telemetry.access import AccessRecord

log = logging.getLogger("kvserve.server")

# After the grace, aborted requests get this long to send their last bytes.
ABORT_WAIT_S = 5.0


class Lifecycle:
    """The app's shutdown state: whether it drains, and the requests in flight."""

    def __init__(self) -> None:
        self.draining = False
        self.inflight: set[AccessRecord] = set()

    async def drain(self, grace_s: float) -> None:
        """Refuse new requests, wait up to `grace_s` for in-flight ones, abort the rest."""
        self.draining = True
        loop = asyncio.get_running_loop()
        log.info("draining: %d request(s) in flight, grace %.1fs", len(self.inflight), grace_s)
        if await self._wait_idle(loop.time() + grace_s):
            return
        log.warning("shutdown grace over: cancelling %d request(s)", len(self.inflight))
        for record in list(self.inflight):
            record.cancel()
        await self._wait_idle(loop.time() + ABORT_WAIT_S)

    async def _wait_idle(self, deadline: float) -> bool:
        loop = asyncio.get_running_loop()
        while self.inflight and loop.time() < deadline:
            await asyncio.sleep(0.05)
        return not self.inflight
