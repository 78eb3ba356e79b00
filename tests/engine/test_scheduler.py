"""Scheduler policy, without a model."""

from __future__ import annotations

import pytest

from cache import CacheHit
from engine.detokenizer import IncrementalDetokenizer
from engine.exact_rules import exact_min_rows
from engine.sequence import SeqStatus, Sequence
from engine.thread.scheduler import Scheduler, SchedulerConfig
from engine.thread.slots import Copy, Drop, Restore, Save
from engine.types import GenerateRequest


def seq(name: str, num_prompt: int) -> Sequence:
    request = GenerateRequest(name, tuple(range(1, num_prompt + 1)))
    return Sequence(request, None, IncrementalDetokenizer([b""]), None)


def sched(slots: int = 4, n_ctx: int = 1000, step: int = 64, chunk: int = 32) -> Scheduler:
    return Scheduler(SchedulerConfig(slots, n_ctx, n_ctx, step, chunk, exact=False))


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
    drop = s.remove(a)
    assert drop is not None and drop.start == 0 and a.status is SeqStatus.FINISHED
    slot = drop.slot
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
    assert s.counters.num_preemptions == 1
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
    return Scheduler(SchedulerConfig(slots, n_ctx_seq * slots, n_ctx_seq, 64, 32, exact=False))


def seq_of(name: str, tokens: list[int]) -> Sequence:
    return Sequence(GenerateRequest(name, tuple(tokens)), None, IncrementalDetokenizer([b""]), None)


def test_common_prefix() -> None:
    from engine.thread.scheduler import common_prefix

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
    assert kv.ops == [Drop(first_slot, 30, second)]  # the unshared tail goes
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
    assert c.slot == slot_a and kv.ops == [Drop(slot_a, 0, c)] and c.num_cached == 0
    assert slot_b in s.slots.resident


def test_failed_sequence_leaves_nothing_resident() -> None:
    s = per_slot()
    a = seq_of("a", [1, 2, 3])
    s.add(a)
    apply(s)
    slot = a.slot
    assert s.remove(a, keep_kv=False) == Drop(slot)  # type: ignore[arg-type]
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
    assert kv.ops == [Copy(0, 1, b), Drop(1, 40, b)]
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


# -- sessions, salts, siblings, the cache -------------------------------------------


def seq_in(name: str, tokens: list[int], **kw: object) -> Sequence:
    request = GenerateRequest(name, tuple(tokens), **kw)  # type: ignore[arg-type]
    return Sequence(request, None, IncrementalDetokenizer([b""]), None)


def run_to_finish(s: Scheduler, x: Sequence) -> None:
    while not x.is_decoding:
        apply(s)
    s.remove(x)


def test_a_session_keeps_its_slot_and_prefills_only_the_new_turn() -> None:
    s = per_slot(slots=2)
    turn1 = seq_in("t1", list(range(1, 41)), session_id="chat")
    s.add(turn1)
    run_to_finish(s, turn1)
    slot = s.slots.pins["/chat"]
    other = seq_of("other", list(range(1, 41)))  # same tokens, but may not take the pin
    s.add(other)
    apply(s)
    assert other.slot != slot and other.num_cached == 39  # copied, not placed in the pin
    turn2 = seq_in("t2", list(range(1, 41)) + [7, 8, 9], session_id="chat")
    s.add(turn2)
    apply(s)
    assert turn2.slot == slot and turn2.num_cached == 40 and turn2.hit_kind == "session"
    s.check_integrity()


def test_idle_session_is_reclaimed_lru_and_saved_first() -> None:
    s = per_slot(slots=2)
    a = seq_in("a", list(range(1, 21)), session_id="A")
    b = seq_in("b", list(range(30, 50)), session_id="B")
    s.add(a)
    s.add(b)
    run_to_finish(s, a)
    s.remove(b)
    s.slots.pins.move_to_end("/A")  # A used more recently: B is the LRU
    c = seq_of("c", [5, 5, 5])
    s.add(c)
    _, kv = s.schedule()
    slot_b = 1
    assert c.slot == slot_b and "/B" not in s.slots.pins and "/A" in s.slots.pins
    assert isinstance(kv.ops[0], Save) and kv.ops[0].slot == slot_b
    assert s.counters.num_reclaims == 1
    s.check_integrity()


def test_a_session_in_flight_is_never_reclaimed() -> None:
    s = per_slot(slots=1)
    a = seq_in("a", [1, 2, 3], session_id="A")
    s.add(a)
    apply(s)  # A is running in the only slot
    b = seq_of("b", [4, 5])
    s.add(b)
    apply(s)
    assert b.status is SeqStatus.WAITING and a.slot == 0


def test_a_request_on_a_busy_session_waits_without_stalling_the_queue() -> None:
    """Issue 9, item 2: should a second request on a session reach the engine while its
    slot runs (the server refuses it with 409), it waits; the requests behind it go on."""
    s = per_slot(slots=3)
    a = seq_in("a", [1, 2, 3], session_id="A")
    s.add(a)
    apply(s)  # A runs in its pinned slot
    pinned = a.slot
    again = seq_in("a2", [1, 2, 3, 4], session_id="A")
    other = seq_of("other", [9, 9])
    s.add(again)
    s.add(other)
    apply(s)
    assert again.status is SeqStatus.WAITING and other.status is SeqStatus.RUNNING
    s.check_integrity()
    run_to_finish(s, a)
    apply(s)
    assert again.status is SeqStatus.RUNNING and again.slot == pinned


def test_prefixes_are_not_shared_across_salts() -> None:
    s = per_slot(slots=3)
    a = seq_in("a", list(range(1, 41)), cache_salt="tenant-a")
    s.add(a)
    run_to_finish(s, a)
    b = seq_in("b", list(range(1, 41)), cache_salt="tenant-b")
    s.add(b)
    apply(s)
    assert b.num_cached == 0 and b.hit_kind == "cold"
    running_a = seq_in("a2", list(range(1, 41)) + [5], cache_salt="tenant-a")
    s.add(running_a)
    apply(s)
    apply(s)  # a2 and b hold the prefix in busy slots: another salt may not copy it
    d = seq_in("d", list(range(1, 41)), cache_salt="tenant-c")
    s.add(d)
    _, kv = s.schedule()
    assert d.slot == 2 and d.num_cached == 0
    assert not any(isinstance(op, Copy) for op in kv.ops)


def test_siblings_wait_for_the_leader_then_copy_its_prompt() -> None:
    s = per_slot(slots=3)
    prompt = list(range(1, 41))
    leader = seq_of("n0", prompt)
    siblings = [seq_of(f"n{i}", prompt) for i in (1, 2)]
    for x in siblings:
        x.leader = leader
    for x in (leader, *siblings):
        s.add(x)
    apply(s)  # leader prefills its first chunk; siblings wait
    assert all(x.status is SeqStatus.WAITING for x in siblings)
    apply(s)  # leader finishes the prompt and samples
    _, kv = s.schedule()
    assert [x.num_cached for x in siblings] == [39, 39]
    assert [op for op in kv.ops if isinstance(op, Copy)] == [
        Copy(0, 1, siblings[0]),
        Copy(0, 2, siblings[1]),
    ]


def test_a_longer_cached_prefix_is_restored() -> None:
    s = per_slot(slots=1)
    tokens = list(range(1, 81))
    x = seq_of("x", tokens)
    x.cache_hit = CacheHit(tuple(tokens), b"state", 80, "disk")
    s.add(x)
    _, kv = s.schedule()
    assert kv.ops == [Drop(0), Restore(x, 0, kv.ops[1].hit, 79)]  # type: ignore[union-attr]
    assert x.num_cached == 79 and x.hit_kind == "exact" and x.hit_source == "disk"
    assert x.cache_hit is None  # the bytes are not held past admission


def test_fork_copies_an_idle_session_into_a_free_slot() -> None:
    s = per_slot(slots=3)
    a = seq_in("a", list(range(1, 21)), session_id="A")
    s.add(a)
    run_to_finish(s, a)
    ops: list = []
    assert s.slots.fork("/A", "/B", ops) == 20
    src, dst = s.slots.pins["/A"], s.slots.pins["/B"]
    assert src != dst and ops == [Drop(dst), Copy(src, dst)]
    assert s.slots.resident[dst].tokens == s.slots.resident[src].tokens
    s.check_integrity()


# -- exact mode: every reused position is computed as a cold run computes it ----------


def exact(slots: int = 2, chunk: int = 256, step: int = 512, rows: int = 64) -> Scheduler:
    """Exact reuse; `rows`: exact_min_rows (64 with flash attention, 2 without)."""
    return Scheduler(SchedulerConfig(slots, 1000 * slots, 1000, step, chunk, exact_min_rows=rows))


def test_exact_prefill_chunks_are_never_under_64_rows() -> None:
    s = exact(chunk=256)
    s.add(seq_of("a", list(range(1, 301))))
    assert apply(s) == [("a", 0, 236, False)]  # not 256: that would leave a 44-row chunk
    assert apply(s) == [("a", 236, 64, True)]
    t = exact(chunk=256, step=140)
    t.add(seq_of("b", list(range(1, 101))))  # 100 rows: all of it, in one chunk
    t.add(seq_of("c", list(range(1001, 1201))))  # shares no head with b (it would wait)
    assert apply(t) == [("b", 0, 100, True)]  # 40 rows left for c: it waits a step
    # 139 rows of room would leave 61: c takes 136 and leaves a 64-row last chunk.
    assert [p[:3] for p in apply(t)] == [("b", 100, 1), ("c", 0, 136)]


def test_exact_reuse_keeps_prompt_positions_only_and_recomputes_64() -> None:
    s = exact()
    prompt = list(range(1, 101))
    a = seq_of("a", prompt)
    s.add(a)
    apply(s)
    for _ in range(5):
        apply(s)  # five tokens decoded
    drop = s.remove(a)
    assert drop == Drop(0, 100)  # decoded positions go, the prompt stays
    assert s.slots.resident[0].tokens == prompt
    b = seq_of("b", prompt + [7] * 10)
    s.add(b)
    apply(s)
    assert b.num_cached == 44  # 110 - 64, down to a block of 4 rows (engine/exact_rules.py)
    short = seq_of("short", [9] * 63)
    s.add(short)
    apply(s)
    drop = s.remove(short)
    assert drop == Drop(short_slot := 1, 0) and s.slots.resident[short_slot].tokens == []


def test_exact_chunks_and_cuts_start_on_a_block_of_four_rows() -> None:
    """Repacked weights compute rows four at a time and the rest one by one, apart
    (engine/exact_rules.py EXACT_ROW_BLOCK): only a prompt's last rows may be a remainder, and
    they are never reused."""
    s = exact(chunk=250, rows=2)
    a = seq_of("a", list(range(1, 303)))  # 302 rows: 248 (a block floor of 250), then 54
    s.add(a)
    assert apply(s) == [("a", 0, 248, False)]
    assert apply(s) == [("a", 248, 54, True)]
    apply(s)  # a decoded token
    assert s.remove(a) == Drop(0, 300)  # 302 prompt rows, its last 2 a remainder: 300
    b = seq_of("b", list(range(1, 303)) + [7] * 9)  # 311: may keep 309, down to 308 (300 held)
    s.add(b)
    apply(s)
    assert b.num_cached == 300
    c = seq_of("c", list(range(1, 150)) + [5] * 20)  # shares 149 with the resident: 148
    s.add(c)
    apply(s)
    assert c.num_cached == 148


def test_exact_min_rows_follows_flash_attention() -> None:
    assert exact_min_rows(flash_attn=True) == 64
    assert exact_min_rows(flash_attn=False) == 2  # bench/batch_invariance.py


def test_exact_prefill_chunks_without_flash_attention_are_never_under_2_rows() -> None:
    s = exact(chunk=256, rows=2)
    s.add(seq_of("a", list(range(1, 258))))
    # Not 256: that would leave a 1-row chunk; not 255: the next chunk starts on a block.
    assert apply(s) == [("a", 0, 252, False)]
    assert apply(s) == [("a", 252, 5, True)]
    t = exact(chunk=256, step=8, rows=2)
    t.add(seq_of("b", list(range(1, 6))))  # 5 rows: all of it, in one chunk
    t.add(seq_of("c", list(range(1, 10))))
    assert apply(t) == [("b", 0, 5, True)]  # 3 rows left for c: under a block, it waits
    # 7 rows of room would leave c's last 2 rows; a chunk ends on a block: 4, then 5.
    assert [p[:3] for p in apply(t)] == [("b", 5, 1), ("c", 0, 4)]
    assert [p[:3] for p in apply(t)] == [("b", 6, 1), ("c", 4, 5)]


def test_exact_reuse_without_flash_attention_recomputes_2_prompt_tokens() -> None:
    s = exact(rows=2)
    prompt = list(range(1, 101))
    a = seq_of("a", prompt)
    s.add(a)
    apply(s)
    for _ in range(5):
        apply(s)  # five tokens decoded: one-row steps, never reused (their KV differs)
    assert s.remove(a) == Drop(0, 100)
    b = seq_of("b", prompt)
    s.add(b)
    apply(s)
    assert b.num_cached == 96  # 100 - 2, down to a block (100 - 64 with flash attention)
    one = seq_of("one", [9])
    s.add(one)
    apply(s)
    assert s.remove(one) == Drop(1, 0) and s.slots.resident[1].tokens == []


def test_a_single_slot_keeps_its_prefix_even_with_a_unified_cache() -> None:
    s = Scheduler(SchedulerConfig(1, 100, 100, 64, 32, exact=False))  # n_ctx_seq == n_ctx
    a = seq_of("a", [1, 2, 3, 4])
    s.add(a)
    apply(s)
    assert s.remove(a) is None and s.slots.resident[0].tokens == [1, 2, 3, 4]


def test_a_cold_burst_computes_its_shared_head_once() -> None:
    """Agents starting together on one catalogue: one prefills the head, the others
    wait and copy it; a prompt that shares nothing is not held back."""
    s = per_slot(slots=4, n_ctx_seq=400)
    head = list(range(1, 201))
    burst = [seq_of(f"a{i}", head + [1000 + i] * 20) for i in range(3)]
    other = seq_of("z", list(range(5000, 5100)))
    for x in (*burst, other):
        s.add(x)
    computed = dict.fromkeys(("a0", "a1", "a2", "z"), 0)
    copies = []
    for _ in range(20):
        chunks, kv = s.schedule()
        copies += [op for op in kv.ops if isinstance(op, Copy)]
        for c in chunks:
            computed[c.seq.request_id] += c.length if not c.seq.prompt_done else 0
            c.seq.num_computed += c.length
        for c in chunks:
            if c.sample:
                c.seq.tokens.append(7)
        s.check_integrity()
        if all(x.is_decoding for x in (*burst, other)):
            break
    assert all(x.is_decoding for x in (*burst, other))
    assert other.num_cached == 0 and computed["z"] == 100  # admitted at once, cold
    assert computed["a0"] == 220
    for x in burst[1:]:  # each copied most of the head, computed the rest and its tail
        assert x.num_cached >= 200 - 64 and computed[x.request_id] <= 220 - x.num_cached
    assert {op.dst for op in copies} == {burst[1].slot, burst[2].slot}


def test_another_salt_does_not_wait_for_a_head() -> None:
    s = per_slot(slots=2, n_ctx_seq=400)
    head = list(range(1, 201))
    a = seq_in("a", head + [7])
    b = seq_in("b", head + [8], cache_salt="tenant-b")
    s.add(a)
    s.add(b)
    apply(s)
    assert b.status is SeqStatus.RUNNING and b.num_cached == 0


def test_a_warm_short_turn_goes_before_a_cold_long_one_and_aging_bounds_it() -> None:
    s = per_slot(slots=1, n_ctx_seq=400)
    first = seq_of("first", list(range(1, 41)))
    s.add(first)
    while not first.is_decoding:
        apply(s)
    cold = seq_of("cold", list(range(500, 700)))  # arrives first, nothing to reuse
    s.add(cold)
    admitted = []
    history = list(first.tokens)
    for t in range(3):  # the agent's next turns, each extending what the slot holds
        nxt = seq_of(f"turn{t}", history + [900 + t] * 5)
        s.add(nxt)
        s.remove(s.running[0])
        apply(s)
        admitted.append(s.running[0].request_id)
        if nxt.status is SeqStatus.RUNNING:
            # warm: all of the slot is reused but the last sampled token (never computed)
            assert nxt.num_cached == len(history) - 1
            while not nxt.is_decoding:
                apply(s)
            history = list(nxt.tokens)
    # Twice (OVERTAKE_LIMIT_PER_SLOT x 1 slot) the warm turn went first; then the cold
    # one had waited long enough.
    assert admitted == ["turn0", "turn1", "cold"]


def test_the_queue_is_ranked_only_when_a_slot_can_be_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranking compares each queued prompt with every slot's tokens: not done on the
    steps where every slot runs (most steps when agents outnumber slots)."""
    import engine.thread.scheduler as scheduler

    ranked = []
    monkeypatch.setattr(scheduler, "rank_waiting", lambda *a: ranked.append(len(a[0])))
    s = sched(slots=2)
    running = [seq(f"r{i}", 10) for i in range(2)]
    for r in running:
        s.add(r)
    apply(s)
    assert len(ranked) == 1  # the first step: two slots free
    for i in range(3):
        s.add(seq(f"w{i}", 10))
    for _ in range(3):
        apply(s)
    assert len(ranked) == 1 and len(s.waiting) == 3
    s.remove(running[0])  # a slot frees: the queue is ranked, one is admitted
    apply(s)
    assert len(ranked) == 2 and len(s.waiting) == 2
