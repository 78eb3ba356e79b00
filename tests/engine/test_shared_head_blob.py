"""A cold burst sharing a head on a sliding-window or recurrent model, without a model:
the sequence prefilling the head stops where a follower's prompt parts from it, and the
follower copies its state there (through a blob, which serves only prompts extending
it) instead of computing the same head in another slot."""

from __future__ import annotations

import pytest

from engine.thread.admission import waits_for_shared_head
from engine.thread.scheduler import Scheduler, SchedulerConfig
from engine.thread.slots import Copy, Save
from tests.engine.test_scheduler import seq_of

BLOB_BOUND = {
    "whole_state": SchedulerConfig(2, 2000, 1000, 512, 256, exact=False, whole_state=True),
    "window": SchedulerConfig(2, 2000, 1000, 512, 256, exact=False, n_swa=32),
}


def step(s: Scheduler, computed: dict[str, int], ops: list) -> None:
    """One schedule() as the worker would run it, counting the prompt rows computed; each
    Copy is noted with how far its source stood when it ran (before the step's decode)."""
    chunks, kv = s.schedule()
    at = {seq.slot: seq.num_computed for seq in s.running}
    ops += [(op, at.get(op.src)) if isinstance(op, Copy) else op for op in kv.ops]
    for c in chunks:
        if not c.seq.prompt_done:
            computed[c.seq.request_id] = computed.get(c.seq.request_id, 0) + c.length
        c.seq.num_computed += c.length
    for c in chunks:
        if c.sample:
            c.seq.tokens.append(7)
    s.check_integrity()


@pytest.mark.parametrize("memory", sorted(BLOB_BOUND))
def test_the_follower_copies_the_head_where_the_leader_stops(memory: str) -> None:
    config = BLOB_BOUND[memory]
    s = Scheduler(config)
    a = seq_of("a", list(range(600)))
    b = seq_of("b", list(range(500)) + [9] * 50)
    s.add(a)
    s.add(b)
    computed: dict[str, int] = {}
    ops: list = []
    step(s, computed, ops)
    # One is admitted (the least prompt to compute goes first: engine/thread/admission.py), the
    # other waits; the first will stop at 500, where their prompts part.
    (leader,) = s.running
    follower = b if leader is a else a
    assert follower.slot is None and 500 in leader.checkpoints
    for _ in range(10):
        step(s, computed, ops)
        if follower.slot is not None:
            break
    copies = [op for op in ops if isinstance(op, tuple)]
    assert copies == [(Copy(leader.slot, follower.slot, follower), 500)]  # where it stood
    assert follower.num_cached == 500
    while not (leader.is_decoding and follower.is_decoding):
        step(s, computed, ops)
    assert computed == {leader.request_id: len(leader.tokens) - 1,
                        follower.request_id: len(follower.tokens) - 1 - 500}  # fmt: skip


def test_a_leader_past_the_parting_point_holds_nobody_back() -> None:
    config = BLOB_BOUND["window"]
    s = Scheduler(config)
    leader = seq_of("leader", list(range(600)))
    s.add(leader)
    s.schedule()
    leader.num_computed = 300  # past where the follower's prompt parts from it
    follower = seq_of("follower", list(range(200)) + [9] * 50)
    assert not waits_for_shared_head(follower, s.running, s.slots, config)
    assert 200 not in leader.checkpoints


def test_identical_prompts_stop_the_leader_one_token_short() -> None:
    """The follower samples from its own last prompt token: the leader stops before it."""
    config = BLOB_BOUND["whole_state"]
    s = Scheduler(config)
    leader = seq_of("leader", list(range(600)))
    s.add(leader)
    s.schedule()
    twin = seq_of("twin", list(range(600)))
    assert waits_for_shared_head(twin, s.running, s.slots, config)
    assert leader.checkpoints[-1] == 599


def test_exact_reuse_does_not_hold_a_blob_bound_leader() -> None:
    config = SchedulerConfig(2, 2000, 1000, 512, 256, exact=True, exact_min_rows=8,
                             n_swa=32, checkpoint_tokens=32)  # fmt: skip
    s = Scheduler(config)
    leader = seq_of("leader", list(range(600)))
    s.add(leader)
    s.schedule()
    before = list(leader.checkpoints)
    follower = seq_of("follower", list(range(500)) + [9] * 50)
    assert not waits_for_shared_head(follower, s.running, s.slots, config)
    assert leader.checkpoints == before


def test_save_at_the_stop() -> None:
    """The leader's stop is a checkpoint: postprocess saves its state there."""
    from engine.thread.postprocess import StepRules, save_long_prefill
    from engine.thread.stats import StepCounters

    config = BLOB_BOUND["window"]
    s = Scheduler(config)
    leader = seq_of("leader", list(range(600)))
    s.add(leader)
    s.schedule()
    waits_for_shared_head(seq_of("f", list(range(500)) + [9] * 50), s.running, s.slots, config)
    leader.num_computed = 500
    save = save_long_prefill(leader, StepRules((), 1000), StepCounters())
    assert isinstance(save, Save) and len(save.tokens) == 500
