"""A fork waits for the engine thread's answer only while a thread lives to give it
(engine/loop/session_ops.py): one that stopped before taking the command hung the request."""

from __future__ import annotations

import asyncio
import queue
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from engine.config import SessionLimits
from engine.loop.session_ops import SessionOps
from engine.loop.sessions import SessionRegistry
from engine.types import EngineNotReadyError


class Ops(SessionOps):
    """The sessions of an engine whose thread is `thread`; commands go to a queue that
    only `thread` (if anything) reads."""

    def __init__(self, thread: threading.Thread | None) -> None:
        self.sessions = SessionRegistry(SessionLimits())
        self.commands: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._worker = SimpleNamespace(commands=self.commands)  # type: ignore[assignment]
        self._thread = thread

    def _require_model(self) -> Any:
        return None


async def test_a_fork_on_a_stopped_engine_thread_is_a_503_not_a_hang() -> None:
    stopped = threading.Thread(target=lambda: None)
    stopped.start()
    stopped.join()
    ops = Ops(stopped)
    ops.create_session("t", "a")
    with pytest.raises(EngineNotReadyError):
        await asyncio.wait_for(ops.fork_session("t", "a", "b"), 5.0)
    assert [s.id for s in ops.list_sessions("t")] == ["a"]  # the new one is forgotten


async def test_a_fork_answered_by_a_live_thread_after_a_while_completes() -> None:
    loop_ready = threading.Event()
    ops: Ops

    def engine_thread() -> None:  # answers after the first liveness check
        loop_ready.wait()
        command = ops.commands.get()
        threading.Event().wait(1.5)
        command.on_done(7, None)

    thread = threading.Thread(target=engine_thread)
    ops = Ops(thread)
    thread.start()
    ops.create_session("t", "a")
    loop_ready.set()
    forked = await asyncio.wait_for(ops.fork_session("t", "a", "b"), 5.0)
    thread.join()
    assert forked.id == "b" and forked.num_tokens == 7 and not forked.in_flight
