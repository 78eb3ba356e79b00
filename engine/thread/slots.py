"""Slot bookkeeping: which slots are free, what KV a free slot still holds, which
session pins which slot, and the KV operations the worker must run before a step.

Pure Python, no llama.cpp: the scheduler decides with it, the worker executes the ops.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.thread.stats import StepCounters
from engine.types import SlotView

if TYPE_CHECKING:
    from cache import CacheHit
    from engine.sequence import Sequence


@dataclass(slots=True)
class Resident:
    """Tokens whose KV a free slot still holds (the first len(tokens) positions)."""

    tokens: list[int]
    salt: str
    saved: bool = False  # already handed to the prefix cache
    floor: int = 0  # the shortest prefix a cut may leave (Sequence.kv_floor)


def window_floor(num_tokens: int, n_swa: int) -> int:
    """The shortest prefix a state of `num_tokens` tokens may be cut back to once it went
    through a state blob (a restore from the cache, a copy between slots): llama.cpp
    writes a sequence's sliding-window layers only for the positions the next token
    attends to (the last n_swa), so a cut further back would leave the window without
    cells. (Under exact reuse the blob is restored with its window in the cells a cold
    sequence holds it in: engine/thread/window_blob.py.) 0: any cut (no window, or a state no
    longer than it)."""
    if not 0 < n_swa < num_tokens:
        return 0
    return num_tokens - 1


# KV operations, run by the worker in plan order before the step's decode.


@dataclass(frozen=True, slots=True)
class Save:
    """Copy the slot's KV state out to the prefix cache (it is about to be reused)."""

    slot: int
    tokens: tuple[int, ...]
    salt: str


@dataclass(frozen=True, slots=True)
class Restore:
    """Load a cached state into the (empty) slot, then keep its first `keep` positions.
    On failure the worker sends `seq` back to a cold prefill."""

    seq: Sequence
    slot: int
    hit: CacheHit
    keep: int


@dataclass(frozen=True, slots=True)
class Copy:
    """Make `dst`'s KV a copy of `src`'s (at once: see `Context.copy_seq`). On failure
    the worker sends `seq` (if any) back to a cold prefill."""

    src: int
    dst: int
    seq: Sequence | None = None


@dataclass(frozen=True, slots=True)
class Drop:
    """Drop the slot's cells at positions >= start. Where llama.cpp refuses to cut there
    (a recurrent memory), the whole slot is dropped and `seq`, if any (the sequence
    that was to continue from the kept cells), prefills cold."""

    slot: int
    start: int = 0
    seq: Sequence | None = None


KvOp = Save | Restore | Copy | Drop


class SlotTable:
    """Free slots, their resident prefixes, and session pins. Engine thread only.

    A pinned slot belongs to its session: nobody else is placed in it while the session
    is idle, until `reclaim` takes it from the least recently used idle session.
    """

    def __init__(
        self,
        num_slots: int,
        keeps_prefixes: bool,
        counters: StepCounters | None = None,
        n_swa: int = 0,
        exact: bool = False,
    ):
        self.keeps_prefixes = keeps_prefixes
        self.n_swa, self.exact = n_swa, exact  # the model's sliding window (window_floor)
        self.free: list[int] = list(range(num_slots))
        self.resident: dict[int, Resident] = {}  # free slot -> what it still holds
        self.pins: OrderedDict[str, int] = OrderedDict()  # session -> slot, LRU first
        self.pinned: dict[int, str] = {}  # slot -> session
        # The pins as other threads may read them (Worker.pinned_sessions): a new dict at
        # every change, never changed once published, so the event loop reads one whole
        # state without a lock and never the OrderedDict this thread is changing.
        self.published_pins: Mapping[str, int] = {}
        self.counters = counters if counters is not None else StepCounters()  # num_reclaims

    def pin(self, session_id: str, slot: int) -> None:
        self.unpin(session_id)
        self.pins[session_id] = slot
        self.pinned[slot] = session_id
        self.published_pins = dict(self.pins)

    def unpin(self, session_id: str) -> int | None:
        slot = self.pins.pop(session_id, None)
        if slot is not None:
            self.pinned.pop(slot, None)
            self.published_pins = dict(self.pins)
        return slot

    def touch(self, session_id: str) -> None:
        """The session is used now: the last one `reclaim` takes a slot from."""
        self.pins.move_to_end(session_id)

    def take(self, slot: int, session_id: str | None = None) -> bool:
        """Give the free `slot` to a sequence (of `session_id`: pinned to it). Returns
        whether the slot held a resident prefix (its cells are still there)."""
        had_resident = self.resident.pop(slot, None) is not None
        self.free.remove(slot)
        if session_id is not None:
            self.pin(session_id, slot)
        return had_resident

    def release(self, slot: int, resident: Resident | None = None) -> None:
        """The slot's sequence left; `resident`: the prefix its KV still holds."""
        self.free.append(slot)
        if resident is not None:
            self.resident[slot] = resident

    def forget(self, slot: int) -> None:
        """The free slot holds nothing reusable any more."""
        self.resident.pop(slot, None)

    def forget_all(self) -> None:
        """No free slot holds anything reusable (the KV was cleared)."""
        self.resident.clear()

    def unpinned_free(self) -> list[int]:
        return [slot for slot in self.free if slot not in self.pinned]

    def idle_session_slots(self) -> list[tuple[str, int]]:
        """(session, slot) of sessions with no request in flight, least recent first."""
        return [(sid, slot) for sid, slot in self.pins.items() if slot in self.free]

    def reclaim(self, ops: list[KvOp], *, exclude: int | None = None) -> int | None:
        """Unpin the least recently used idle session's slot, saving its KV first
        (unless the cache already has it). Returns the slot, or None if every pinned
        slot has a request in flight."""
        for session_id, slot in self.idle_session_slots():
            if slot == exclude:
                continue
            resident = self.resident.get(slot)
            if resident is not None and not resident.saved:
                ops.append(Save(slot, tuple(resident.tokens), resident.salt))
                resident.saved = True
            self.unpin(session_id)
            self.counters.num_reclaims += 1
            return slot
        return None

    def fork(self, source: str, target: str, ops: list[KvOp]) -> int:
        """Pin a copy of idle session `source`'s slot to the new session `target`.

        Returns the number of tokens the copy holds. Raises LookupError when the source
        holds no slot, and RuntimeError when no slot can be had for the copy."""
        src = self.pins.get(source)
        if src is None or src not in self.free:
            raise LookupError(source)
        candidates = self.unpinned_free()
        # Prefer a slot holding nothing: a resident prefix may still serve someone.
        slot = (
            min(candidates, key=lambda s: (s in self.resident, s))
            if candidates
            else self.reclaim(ops, exclude=src)
        )
        if slot is None:
            raise RuntimeError("no free slot")
        self.resident.pop(slot, None)
        ops.extend((Drop(slot), Copy(src, slot)))
        original = self.resident.get(src)
        if original is not None:
            # A copy goes through the state blob: a sliding window's older cells stay behind.
            floor = window_floor(len(original.tokens), self.n_swa)
            self.resident[slot] = Resident(list(original.tokens), original.salt, original.saved,
                                           max(floor, original.floor))  # fmt: skip
        self.pin(target, slot)
        return len(original.tokens) if original is not None else 0

    def check(self, num_slots: int, busy: list[int]) -> None:
        assert len(set(busy)) == len(busy), "two running sequences share a slot"
        assert not set(busy) & set(self.free), "a running slot is also free"
        assert len(busy) + len(self.free) == num_slots, "a slot leaked"
        assert set(self.resident) <= set(self.free), "a busy slot has resident tokens"
        assert {v: k for k, v in self.pins.items()} == self.pinned, "pins out of sync"
        assert len(set(self.pins.values())) == len(self.pins), "two sessions pin a slot"
        assert self.published_pins == self.pins, "published pins out of date"


def slot_views(table: SlotTable, running: list[Sequence], num_slots: int) -> tuple[SlotView, ...]:
    """Each slot for the status page: the sequence running in it, else what it keeps.
    Called from another thread: copies first (each one C call under the GIL), so the
    picture may be a step old, never an error."""
    pinned, resident = table.pinned.copy(), table.resident.copy()
    active = {seq.slot: seq for seq in list(running) if seq.slot is not None}
    views = []
    for index in range(num_slots):
        seq = active.get(index)
        if seq is not None:
            views.append(SlotView(index, True, seq.session_id, seq.num_computed))
        else:
            kept = resident.get(index)
            views.append(SlotView(index, False, pinned.get(index), len(kept.tokens) if kept else 0))
    return tuple(views)
