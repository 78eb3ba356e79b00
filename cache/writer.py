"""The writer thread: takes saves off the engine thread through a bounded queue.

submit() never blocks: a full queue refuses the job, and the caller counts the drop. The
engine thread has already copied the state out of llama.cpp, so it never waits on I/O.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)
Job = TypeVar("Job")


class Writer(Generic[Job]):
    def __init__(
        self, run: Callable[[Job], None], on_error: Callable[[], None], max_pending: int
    ) -> None:
        self._run = run
        self._on_error = on_error
        self._queue: queue.Queue[Job | None] = queue.Queue(max_pending)
        self._idle = threading.Condition()  # notified when _pending drops to 0
        self._pending = 0  # jobs accepted and not finished
        self._thread = threading.Thread(target=self._loop, name="kv-cache-writer")
        self._thread.daemon = True  # a writer stuck on a dead disk must not block exit
        self._thread.start()

    def submit(self, job: Job) -> bool:
        """Queue `job` without blocking; False when the queue is full."""
        with self._idle:
            try:
                self._queue.put_nowait(job)
            except queue.Full:
                return False
            self._pending += 1
        return True

    def _loop(self) -> None:
        while (job := self._queue.get()) is not None:
            try:
                self._run(job)
            except Exception:  # a bug here must not kill the writer and hang flush()
                log.exception("cache: storing an entry failed")
                self._on_error()
            finally:
                with self._idle:
                    self._pending -= 1
                    if self._pending == 0:
                        self._idle.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every accepted job has run; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def close(self, timeout: float | None = None) -> None:
        """Run what is queued, then stop the thread (left behind if still stuck)."""
        self.flush(timeout)
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            log.warning("cache: writer still busy at close; leaving it behind")
            return
        self._thread.join(timeout)
