"""The decode watchdog: interrupts a llama_decode that runs past its budget.

The engine thread sets `worker.decode_deadline` around each step's decode; this thread
looks at it a few times a second and, past it, sets the context's abort flag (see
`Context.interrupt`). llama.cpp then returns 2 from llama_decode, the worker fails
that step's sequences and carries on with the same context.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from engine.thread.worker import Worker

POLL_S = 0.1


class Watchdog:
    def __init__(self, current: Callable[[], Worker | None]):
        self._current = current  # the live worker (a rebuilt engine has a new one)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvserve-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            worker = self._current()
            if worker is None:
                continue
            deadline = worker.decode_deadline
            if deadline and time.monotonic() > deadline:
                worker.ctx.interrupt()
