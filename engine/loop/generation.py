"""`Generation`: what the server holds of one API request while the engine runs it."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence

from engine.lane import Lane
from engine.loop.sessions import Session
from engine.types import SeqOutput


class Generation:
    """The outputs of one API request: `n` sequences of one prompt, interleaved.

    Iterate to receive `(index, SeqOutput)` until every sequence has finished. Leaving
    early (`async with` exit, or `abort()`) aborts the sequences still running.
    """

    def __init__(
        self,
        request_ids: Sequence[str],
        abort: Callable[[list[str]], None],
        session_id: str | None = None,
        session: Session | None = None,
        tenant: str = "",
        hold: Callable[[list[str]], None] | None = None,
        open_lane: Callable[[str, Lane], None] | None = None,
    ):
        self.tenant = tenant
        self.request_ids = list(request_ids)
        self.session_id = session_id
        self.session = session  # the one its end updates (the id may change hands)
        self._abort = abort
        self._hold = hold
        self._open_lane = open_lane
        self._lane: Lane | None = None
        self._unwritten = 0  # outputs received that no lane wrote (the lane's `paid`)
        # Not an asyncio.Queue: one reader, and this is the path of every streamed token
        # (a deque and one future cost a fraction of the queue's getters and putters).
        self._ready: deque[tuple[int, SeqOutput]] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._last_put = 0.0  # time.monotonic() at the last output (the heartbeat's clock)
        self._open = set(range(len(request_ids)))

    def put(self, index: int, output: SeqOutput) -> None:
        """Called on the event loop with each output the engine produced."""
        self._ready.append((index, output))
        if not output.written:
            self._unwritten += 1
        self._last_put = time.monotonic()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        """Until `put` or the heartbeat's timer wakes the reader."""
        if self._lane is not None:  # all it received is sent: the lane may write again
            self._lane.paid = self._unwritten
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _take(self) -> tuple[int, SeqOutput]:
        index, output = self._ready.popleft()
        if output.finish_reason is not None:
            self._open.discard(index)
        return index, output

    @property
    def finished(self) -> bool:
        return not self._open

    async def __aiter__(self) -> AsyncIterator[tuple[int, SeqOutput]]:
        while self._open:
            while not self._ready:
                await self._wait()
            yield self._take()

    async def outputs(self, idle_s: float) -> AsyncIterator[tuple[int, SeqOutput] | None]:
        """As iterating, and None after every `idle_s` seconds without an output (a
        stream's heartbeat, sent in its order with the rest: a long prefill is silent).

        One timer for the whole iteration, not one per output: when it fires it looks
        at the time of the last output (or heartbeat) and either wakes the reader for a
        heartbeat or sets itself for `idle_s` after that output."""
        loop = asyncio.get_running_loop()
        self._last_put = beat_at = time.monotonic()
        beat = False
        timer: asyncio.TimerHandle

        def tick() -> None:
            nonlocal timer, beat, beat_at
            if not self._open:
                return
            now = time.monotonic()
            due = max(self._last_put, beat_at) + idle_s
            if now >= due:
                beat, beat_at, due = True, now, now + idle_s
                self._wake()
            timer = loop.call_later(due - now, tick)

        timer = loop.call_later(idle_s, tick)
        try:
            while self._open:
                while not self._ready and not beat:
                    await self._wait()
                beat = False  # an output due now serves as the heartbeat too
                yield self._take() if self._ready else None
        finally:
            timer.cancel()

    def ready_nowait(self, written: bool = False) -> list[tuple[int, SeqOutput]]:
        """Outputs already waiting, without blocking (lets a slow reader coalesce): those
        its lane wrote, or (`written` False) those it did not, up to the first other."""
        items = []
        while self._open and self._ready and self._ready[0][1].written == written:
            items.append(self._take())
        return items

    def hold_outputs(self) -> None:
        """Its reader wants the whole replies, not each token: the engine hands over
        the first token, then merged outputs at most every half second, and the end
        (engine/thread/holding.py)."""
        if self._hold is not None and self._open:
            self._hold([self.request_ids[i] for i in sorted(self._open)])

    def open_lane(self, lane: Lane) -> None:
        """Its reader streams plain text: the engine thread may write each output to the
        client itself, through `lane` (engine/thread/lanes.py). One sequence only."""
        if self._open_lane is not None and len(self.request_ids) == 1 and self._open:
            self._lane = lane
            self._open_lane(self.request_ids[0], lane)

    def abort(self) -> None:
        if self._open:
            self._abort([self.request_ids[i] for i in sorted(self._open)])

    async def __aenter__(self) -> Generation:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.abort()
