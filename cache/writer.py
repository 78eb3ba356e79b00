"""The writer thread: takes saves off the engine thread through a bounded queue.

submit() does not block: a full queue refuses the job, and the caller counts the drop.
The engine thread has already copied the state out of llama.cpp, so it never waits on
I/O. A drain (shutdown, unload) is the exception: it promises to save what the slots
hold, so its submits wait for room, and close() waits for every queued job, both for as
long as the writer makes progress (a job done at least every STALL_S seconds).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)
Job = TypeVar("Job")

# A writer that finished no job for this long is taken as stuck (a dead disk): a drain
# gives up on it, logging and counting what it did not store, rather than hang.
STALL_S = 10.0


class Writer(Generic[Job]):
    def __init__(
        self, run: Callable[[Job], None], on_error: Callable[[], None], max_pending: int
    ) -> None:
        self._run = run
        self._on_error = on_error
        self._queue: queue.Queue[Job | None] = queue.Queue(max_pending)
        self._idle = threading.Condition()  # notified whenever a job finishes
        self._pending = 0  # jobs accepted and not finished
        self._num_done = 0  # jobs finished, for telling progress from a stall
        self._thread = threading.Thread(target=self._loop, name="kv-cache-writer")
        self._thread.daemon = True  # a writer stuck on a dead disk must not block exit
        self._thread.start()

    def submit(self, job: Job, *, wait: bool = False) -> bool:
        """Queue `job`; False when the queue is full (at once, or with `wait` once the
        writer has finished nothing for STALL_S)."""
        with self._idle:
            self._pending += 1  # before the put: the writer may finish it at once
        try:
            if wait:
                self._put_while_progressing(job)
            else:
                self._queue.put_nowait(job)
        except queue.Full:
            self._job_done(counted=False)
            return False
        return True

    def _put_while_progressing(self, job: Job) -> None:
        while True:
            num_done = self._num_done
            try:
                return self._queue.put(job, timeout=STALL_S)
            except queue.Full:
                if self._num_done == num_done:
                    raise

    def _loop(self) -> None:
        while (job := self._queue.get()) is not None:
            try:
                self._run(job)
            except Exception:  # a bug here must not kill the writer and hang flush()
                log.exception("cache: storing an entry failed")
                self._on_error()
            finally:
                self._job_done(counted=True)

    def _job_done(self, *, counted: bool) -> None:
        with self._idle:
            self._pending -= 1
            self._num_done += counted
            self._idle.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every accepted job has run; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def drain(self, stall_s: float | None) -> int:
        """Wait until every accepted job has run, for as long as one finishes at least
        every `stall_s` seconds (None: however long it takes). The jobs left undone."""
        with self._idle:
            while self._pending:
                since = time.monotonic()
                if not self._idle.wait_for(self._progress_since(self._num_done), stall_s):
                    log.warning(
                        "cache: the writer finished nothing for %.0fs", time.monotonic() - since
                    )
                    break
            return self._pending

    def _progress_since(self, num_done: int) -> Callable[[], bool]:
        return lambda: self._pending == 0 or self._num_done != num_done

    def close(self, timeout: float | None = STALL_S) -> int:
        """Run what is queued (see `drain`: `timeout` bounds a stall, not the whole
        drain), then stop the thread (left behind if stuck). The jobs not run."""
        left = self.drain(timeout)
        if left:
            log.error("cache: %d queued save(s) not stored: the writer is stuck", left)
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            log.warning("cache: writer still busy at close; leaving it behind")
            return left
        self._thread.join(timeout)
        return left
