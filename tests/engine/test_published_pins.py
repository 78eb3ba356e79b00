"""The pins the engine thread publishes, the only view of them the event loop reads:
a whole new map at every change, never changed once published."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.loop.session_ops import SessionOps
from engine.thread.slots import KvOp, SlotTable


def test_every_pin_change_publishes_a_new_map_and_leaves_the_old_one_whole() -> None:
    slots = SlotTable(3, True)
    assert slots.published_pins == {}
    slots.pin("k/a", 0)
    first = slots.published_pins
    assert first == {"k/a": 0}
    slots.pin("k/b", 1)
    slots.pin("k/a", 2)  # moved: one slot a session, as the table keeps it
    assert slots.published_pins == {"k/a": 2, "k/b": 1}
    assert first == {"k/a": 0}, "a map the loop may be reading was changed in place"
    assert slots.unpin("k/b") == 1
    assert slots.published_pins == {"k/a": 2}
    slots.check(len(slots.free), [])


def test_a_reclaimed_slot_is_unpinned_in_the_published_map() -> None:
    slots = SlotTable(1, True)
    slots.pin("k/a", 0)
    ops: list[KvOp] = []
    assert slots.reclaim(ops) == 0
    assert slots.published_pins == {}
    slots.check(len(slots.free), [])


@dataclass
class Published:
    """An EngineThread as the loop sees it (engine/commands.py)."""

    pinned_sessions: Mapping[str, int] = field(default_factory=dict)

    def find_prefix(self, cache: Any, prompt: Sequence[int], salt: str) -> Any:
        return cache.lookup(prompt, salt)


class Loop(SessionOps):
    def __init__(self, worker: Published | None) -> None:
        self._worker = worker  # type: ignore[assignment]


def test_the_loop_reads_a_session_slot_from_what_the_thread_published() -> None:
    worker = Published({"k/a": 1})
    loop = Loop(worker)
    assert loop.session_slot("k/a") == 1
    assert loop.session_slot("k/b") is None
    assert loop.session_slot(None) is None
    worker.pinned_sessions = {}  # the thread's next publication
    assert loop.session_slot("k/a") is None
    assert Loop(None).session_slot("k/a") is None  # no engine thread: nothing pinned
