"""The app's shutdown state (`Lifecycle`): whether it drains, and the requests in flight.

Apart from server/process/serve.py and server/process/graceful.py, which run the app, so
that the app and its middleware can hold it without importing what runs them (see
server/process/graceful.py for the drain)."""

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
