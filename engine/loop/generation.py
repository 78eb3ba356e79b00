"""`Generation`: what the server holds of one API request while the engine runs it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence

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
    ):
        self.tenant = tenant
        self.request_ids = list(request_ids)
        self.session_id = session_id
        self.session = session  # the one its end updates (the id may change hands)
        self._abort = abort
        self._hold = hold
        self._queue: asyncio.Queue[tuple[int, SeqOutput]] = asyncio.Queue()
        self._open = set(range(len(request_ids)))

    def put(self, index: int, output: SeqOutput) -> None:
        """Called on the event loop with each output the engine produced."""
        self._queue.put_nowait((index, output))

    @property
    def finished(self) -> bool:
        return not self._open

    async def __aiter__(self) -> AsyncIterator[tuple[int, SeqOutput]]:
        while self._open:
            index, output = await self._queue.get()
            if output.finish_reason is not None:
                self._open.discard(index)
            yield index, output

    async def outputs(self, idle_s: float) -> AsyncIterator[tuple[int, SeqOutput] | None]:
        """As iterating, and None after every `idle_s` seconds without an output (a
        stream's heartbeat, sent in its order with the rest: a long prefill is silent).
        Waiting on the queue is cancelled by the timeout, never the iteration."""
        while self._open:
            try:
                async with asyncio.timeout(idle_s):
                    index, output = await self._queue.get()
            except TimeoutError:
                yield None
                continue
            if output.finish_reason is not None:
                self._open.discard(index)
            yield index, output

    def ready_nowait(self) -> list[tuple[int, SeqOutput]]:
        """Outputs already waiting, without blocking (lets a slow reader coalesce)."""
        items = []
        while self._open and not self._queue.empty():
            index, output = self._queue.get_nowait()
            if output.finish_reason is not None:
                self._open.discard(index)
            items.append((index, output))
        return items

    def hold_outputs(self) -> None:
        """Its reader wants the whole replies, not each token: the engine hands over
        the first token, then merged outputs at most every half second, and the end
        (engine/thread/holding.py)."""
        if self._hold is not None and self._open:
            self._hold([self.request_ids[i] for i in sorted(self._open)])

    def abort(self) -> None:
        if self._open:
            self._abort([self.request_ids[i] for i in sorted(self._open)])

    async def __aenter__(self) -> Generation:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.abort()
