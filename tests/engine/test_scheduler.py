"""Scheduler policy, without a model."""

from __future__ import annotations

from engine.detokenizer import IncrementalDetokenizer
from engine.scheduler import Scheduler, SchedulerConfig
from engine.sequence import SeqStatus, Sequence
from engine.slots import Copy, Drop
from engine.types import GenerateRequest


def seq(name: str, num_prompt: int) -> Sequence:
    request = GenerateRequest(name, tuple(range(1, num_prompt + 1)))
    return Sequence(request, None, IncrementalDetokenizer([b""]), None)


def sched(slots: int = 4, n_ctx: int = 1000, step: int = 64, chunk: int = 32) -> Scheduler:
    return Scheduler(SchedulerConfig(slots, n_ctx, n_ctx, step, chunk))


def apply(s: Scheduler) -> list[tuple[str, int, int, bool]]:
    """Run one schedule() as the worker would, sampling token 7 where asked."""
    chunks, _ = s.schedule()
    for c in chunks:
        c.seq.num_computed += c.length
    for c in chunks:
        if c.sample:
            c.seq.tokens.append(7)
    s.check_integrity()
    return [(c.seq.request_id, c.start, c.length, c.sample) for c in chunks]


def test_long_prompt_is_chunked_and_samples_at_the_end() -> None:
    s = sched(chunk=32)
    s.add(seq("a", 70))
    assert apply(s) == [("a", 0, 32, False)]
    assert apply(s) == [("a", 32, 32, False)]
    assert apply(s) == [("a", 64, 6, True)]
    assert apply(s) == [("a", 70, 1, True)]  # now decoding one token per step


def test_decode_rows_come_first_and_are_never_starved() -> None:
    s = sched(step=40, chunk=32)
    s.add(seq("short", 5))
    apply(s)  # short prefilled and sampled
    s.add(seq("long", 500))
    for _ in range(5):
        plan = apply(s)
        assert plan[0][0] == "short" and plan[0][2] == 1  # a decode row every step
        assert sum(p[2] for p in plan) <= 40  # within the budget
        assert plan[1][0] == "long" and plan[1][2] <= 32  # prefill capped per chunk


def test_prefill_budget_goes_oldest_first() -> None:
    s = sched(step=50, chunk=40)
    s.add(seq("first", 100))
    s.add(seq("second", 100))
    plan = apply(s)
    assert plan == [("first", 0, 40, False), ("second", 0, 10, False)]


def test_fifo_admission_and_slot_reuse() -> None:
    s = sched(slots=2)
    a, b, c = seq("a", 3), seq("b", 3), seq("c", 3)
    for x in (a, b, c):
        s.add(x)
    apply(s)
    assert [x.request_id for x in s.running] == ["a", "b"]
    assert c.status is SeqStatus.WAITING
    slot = s.remove(a)
    assert slot is not None and a.status is SeqStatus.FINISHED
    apply(s)
    assert [x.request_id for x in s.running] == ["b", "c"]
    assert c.slot == slot


def test_remove_waiting_sequence_frees_nothing() -> None:
    s = sched(slots=1)
    a, b = seq("a", 3), seq("b", 3)
    s.add(a)
    s.add(b)
    apply(s)
    assert s.remove(b) is None
    assert list(s.waiting) == []
    s.check_integrity()


def test_admission_respects_kv_cells() -> None:
    s = sched(slots=4, n_ctx=100)
    s.add(seq("a", 60))
    s.add(seq("b", 60))
    apply(s)
    assert [x.request_id for x in s.running] == ["a"]  # b would not fit beside a
    assert [x.request_id for x in s.waiting] == ["b"]


def test_newest_is_preempted_when_decoding_outgrows_the_cache() -> None:
    s = sched(slots=2, n_ctx=20, step=64, chunk=64)
    a, b = seq("a", 9), seq("b", 9)
    s.add(a)
    s.add(b)
    apply(s)  # both prefilled: 10 tokens each committed (prompt + first sample)
    assert s.kv_cells_committed == 20
    apply(s)  # both decode: 11 + 11 committed > 20
    slot_b = b.slot
    chunks, kv = s.schedule()
    assert kv.ops == [Drop(slot_b, 0)]
    assert b.status is SeqStatus.WAITING and b.num_computed == 0 and len(b.tokens) == 11
    assert [c.seq.request_id for c in chunks] == ["a"]
    assert s.num_preemptions == 1
    s.check_integrity()


def test_preempted_sequence_is_reprefilled_whole_and_resumes() -> None:
    s = sched(slots=2, n_ctx=20, step=64, chunk=64)
    a, b = seq("a", 9), seq("b", 9)
    s.add(a)
    s.add(b)
    apply(s)
    apply(s)
    apply(s)  # b preempted here
    s.remove(a)
    plan = apply(s)
    assert plan == [("b", 0, 11, True)]  # all of b's tokens again, then it samples
    assert len(b.tokens) == 12


def per_slot(slots: int = 2, n_ctx_seq: int = 100) -> Scheduler:
    """A stream per slot: finished sequences leave their prefix for reuse."""
    return Scheduler(SchedulerConfig(slots, n_ctx_seq * slots, n_ctx_seq, 64, 32))


def seq_of(name: str, tokens: list[int]) -> Sequence:
    return Sequence(GenerateRequest(name, tuple(tokens)), None, IncrementalDetokenizer([b""]), None)


def test_common_prefix() -> None:
    from engine.scheduler import common_prefix

    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([], [1]) == 0
    long = list(range(1000))
    assert common_prefix(long, long[:700] + [-1] + long[701:]) == 700
    assert common_prefix(long, long) == 1000
    assert common_prefix(long[:512], long) == 512


def test_finished_prefix_is_reused_by_the_next_matching_prompt() -> None:
    s = per_slot()
    first = seq_of("first", list(range(1, 41)))
    s.add(first)
    apply(s)
    apply(s)  # 40 prompt tokens in two chunks, then it samples
    first_slot = first.slot
    assert s.remove(first) is None  # KV kept: nothing for the worker to drop
    assert s.slots.resident[first_slot].tokens == list(range(1, 41))  # type: ignore[index]
    second = seq_of("second", list(range(1, 31)) + [999] * 5)
    s.add(second)
    chunks, kv = s.schedule()
    assert second.slot == first_slot
    assert kv.ops == [Drop(first_slot, 30)]  # the unshared tail goes
    assert second.num_computed == second.num_cached == 30
    assert [(c.start, c.length) for c in chunks] == [(30, 5)]
    s.check_integrity()


def test_identical_prompt_recomputes_only_its_last_token() -> None:
    s = per_slot()
    a = seq_of("a", [5, 6, 7, 8])
    s.add(a)
    apply(s)
    s.remove(a)
    b = seq_of("b", [5, 6, 7, 8])
    s.add(b)
    chunks, _ = s.schedule()
    assert b.num_cached == 3 and [(c.start, c.length, c.sample) for c in chunks] == [(3, 1, True)]


def test_no_match_takes_the_lowest_free_slot_and_clears_it() -> None:
    s = per_slot(slots=2)
    a, b = seq_of("a", [1, 2, 3]), seq_of("b", [4, 5, 6])
    s.add(a)
    s.add(b)
    apply(s)
    slot_a, slot_b = a.slot, b.slot
    s.remove(a)
    s.remove(b)
    c = seq_of("c", [7, 8, 9])
    s.add(c)
    _, kv = s.schedule()
    assert c.slot == slot_a and kv.ops == [Drop(slot_a, 0)] and c.num_cached == 0
    assert slot_b in s.slots.resident


def test_failed_sequence_leaves_nothing_resident() -> None:
    s = per_slot()
    a = seq_of("a", [1, 2, 3])
    s.add(a)
    apply(s)
    slot = a.slot
    assert s.remove(a, keep_kv=False) == slot
    assert slot not in s.slots.resident


def test_batch_rows_are_ordered_by_slot() -> None:
    s = per_slot(slots=4)
    seqs = [seq_of(f"s{i}", [10 * i + 1, 10 * i + 2]) for i in range(4)]
    for x in seqs:
        s.add(x)
    apply(s)
    s.remove(seqs[1])  # slot 1 frees; a newcomer takes it while 0, 2, 3 decode
    s.add(seq_of("new", [99, 98, 97]))
    chunks, _ = s.schedule()
    assert [c.seq.slot for c in chunks] == [0, 1, 2, 3]
    assert [c.length for c in chunks] == [1, 3, 1, 1]


def test_longer_prefix_in_a_busy_slot_is_copied_into_the_new_slot() -> None:
    s = per_slot(slots=3)
    shared = list(range(100, 140))  # 40 tokens
    a = seq_of("a", shared + [1, 2])
    s.add(a)
    apply(s)
    apply(s)  # a: 42 prompt tokens computed, now decoding in slot 0
    b = seq_of("b", shared + [7, 8, 9])
    s.add(b)
    chunks, kv = s.schedule()
    assert (a.slot, b.slot) == (0, 1)
    assert kv.ops == [Copy(0, 1), Drop(1, 40)]
    assert b.num_cached == 40
    assert [(c.seq.request_id, c.start, c.length) for c in chunks] == [("a", 42, 1), ("b", 40, 3)]


def test_short_prefix_elsewhere_is_not_worth_a_copy() -> None:
    s = per_slot(slots=3)
    a = seq_of("a", [1, 2, 3, 4, 5])
    s.add(a)
    apply(s)
    b = seq_of("b", [1, 2, 3, 9])
    s.add(b)
    _, kv = s.schedule()
    assert not any(isinstance(op, Copy) for op in kv.ops) and b.num_cached == 0
