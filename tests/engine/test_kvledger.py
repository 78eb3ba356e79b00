"""The KV ledger, over a stand-in for llama.cpp's memory (no model): it follows every
KV operation, and `check` finds where the scheduler's view and the KV differ."""

from __future__ import annotations

from typing import Any, cast

import pytest

from engine.detokenizer import IncrementalDetokenizer
from engine.sequence import Sequence
from engine.thread.kvledger import KvLedger, KvMismatch
from engine.thread.scheduler import Chunk, Scheduler, SchedulerConfig
from engine.thread.slots import Resident
from engine.types import GenerateRequest


class Memory:
    """Positions held per slot, as llama_memory_seq_pos_max sees them."""

    def __init__(self, slots: int, *, whole: bool = False) -> None:
        self.cells = [0] * slots
        self.copy_ok = True
        self.whole = whole  # a recurrent memory: refuses to cut inside what it holds

    def remove_seq(self, slot: int, start: int = 0) -> bool:
        if self.whole and 0 < start < self.cells[slot]:
            return False
        self.cells[slot] = min(self.cells[slot], start)
        return True

    def copy_seq(self, src: int, dst: int) -> bool:
        self.cells[dst] = self.cells[src] if self.copy_ok else 0
        return self.copy_ok

    def set_seq_state(self, slot: int, state: bytes) -> bool:
        self.cells[slot] = len(state)  # one byte a token, in this stand-in
        return True

    def seq_pos_max(self, slot: int) -> int:
        return self.cells[slot] - 1

    def seq_pos_min(self, slot: int) -> int:
        return 0 if self.cells[slot] else -1

    def clear(self) -> None:
        self.cells = [0] * len(self.cells)


def setup() -> tuple[KvLedger, Memory, Scheduler]:
    memory = Memory(2)
    ledger = KvLedger(cast(Any, memory), 2)
    return ledger, memory, Scheduler(SchedulerConfig(2, 200, 100, 64, 32, exact=False))


def decode(ledger: KvLedger, memory: Memory, seq: Sequence, start: int, length: int) -> None:
    assert seq.slot is not None
    memory.cells[seq.slot] = start + length
    ledger.decoded([Chunk(seq, start, length, False)])


def test_the_ledger_follows_drops_copies_restores_and_decodes() -> None:
    ledger, memory, scheduler = setup()
    seq = Sequence(GenerateRequest("a", (1, 2, 3, 4)), None, IncrementalDetokenizer([b""]), None)
    seq.slot = 0
    decode(ledger, memory, seq, 0, 4)
    assert ledger.holds(0, [1, 2, 3]) and not ledger.holds(0, [1, 2, 9])
    assert ledger.copy_seq(0, 1) and ledger.slots[1] == [1, 2, 3, 4]
    ledger.remove_seq(1, 2)
    assert ledger.slots[1] == [1, 2] and memory.seq_pos_max(1) == 1
    assert ledger.restore(1, b"xyz", (7, 8, 9)) and ledger.slots[1] == [7, 8, 9]
    memory.copy_ok = False
    assert not ledger.copy_seq(0, 1) and ledger.slots[1] == [] and memory.cells[1] == 0
    ledger.clear()
    assert ledger.slots == [[], []]


def test_check_finds_a_slot_that_holds_other_tokens_than_the_scheduler_believes() -> None:
    ledger, memory, scheduler = setup()
    seq = Sequence(GenerateRequest("a", (1, 2, 3, 4)), None, IncrementalDetokenizer([b""]), None)
    seq.slot = 0
    decode(ledger, memory, seq, 0, 4)
    scheduler.slots.resident[0] = Resident([1, 2, 3, 4], "")
    ledger.check(scheduler)
    # A copy into slot 1 the scheduler does not know about: slot 1 should be empty.
    ledger.copy_seq(0, 1)
    with pytest.raises(KvMismatch, match="slot 1"):
        ledger.check(scheduler)
    ledger.remove_seq(1)
    # The scheduler believes slot 0 holds another prompt (the issue 9 failure).
    scheduler.slots.resident[0] = Resident([5, 6, 7, 8], "")
    with pytest.raises(KvMismatch, match="first difference at 0"):
        ledger.check(scheduler)
    # llama.cpp holds more than the ledger says.
    scheduler.slots.resident[0] = Resident([1, 2, 3, 4], "")
    memory.cells[0] = 6
    with pytest.raises(KvMismatch, match="llama.cpp"):
        ledger.check(scheduler)


def test_a_cut_the_memory_refuses_drops_the_whole_slot_and_is_counted() -> None:
    memory = Memory(2, whole=True)  # a recurrent memory: one state per sequence
    ledger = KvLedger(cast(Any, memory), 2)
    seq = Sequence(GenerateRequest("a", (1, 2, 3, 4)), None, IncrementalDetokenizer([b""]), None)
    seq.slot = 0
    decode(ledger, memory, seq, 0, 4)
    assert not ledger.remove_seq(0, 2)  # refused: never a state longer than the ledger says
    assert ledger.slots[0] == [] and memory.cells[0] == 0
    assert ledger.counters.num_refused_drops == 1
    decode(ledger, memory, seq, 0, 4)
    assert ledger.remove_seq(0, 4) and ledger.slots[0] == [1, 2, 3, 4]  # past the end: fine
    assert ledger.remove_seq(0) and memory.cells[0] == 0  # all of it: always
    assert ledger.counters.num_refused_drops == 1


def test_a_planned_cut_that_is_refused_sends_its_sequence_cold() -> None:
    from engine.thread.kvexec import KvExecutor
    from engine.thread.slots import Drop, SlotTable
    from engine.thread.stats import StepCounters

    memory = Memory(2, whole=True)
    ops = KvExecutor(cast(Any, memory), SlotTable(2, True), None, StepCounters(), 2)
    seq = Sequence(GenerateRequest("a", (1, 2, 3, 4, 5)), None, IncrementalDetokenizer([b""]), None)
    seq.slot = 0
    decode(ops.kv, memory, seq, 0, 4)
    seq.num_computed = seq.num_cached = 2  # planned: keep two cells, compute the rest
    assert ops.run([Drop(0, 2, seq)]) == [seq]  # refused: the worker leaves it out this step
    assert (seq.num_computed, seq.num_cached, seq.hit_kind) == (0, 0, "cold")
    assert ops.kv.slots[0] == [] and ops.counters.num_refused_drops == 1
