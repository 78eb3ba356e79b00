"""Exact reuse on whole states, without a model (issue 49): every prompt saves its state
at its own reuse limit on the way (the tail checkpoint), the cache lookup asks only for
states the prompt can start from, a conversation's extension starts from that
checkpoint, and a request that found a stored prefix but reused nothing says why."""

from __future__ import annotations

from cache import CacheHit
from engine.thread.placement import lookup_reach
from engine.thread.postprocess import StepRules, save_long_prefill
from engine.thread.scheduler import Scheduler, SchedulerConfig
from engine.thread.slots import Restore, Save
from engine.thread.stats import StepCounters
from tests.engine.test_whole_state import finish, holding_first, seq_of, whole

ROWS = 8  # whole()'s exact_min_rows


def test_a_prompt_saves_its_state_where_its_extension_may_start() -> None:
    s = whole(exact=True)
    prompt = seq_of("prompt", list(range(100)))
    s.add(prompt)
    chunks, _ = s.schedule()
    assert prompt.checkpoints == [100 - ROWS]
    assert [(c.start, c.length, c.sample) for c in chunks] == [(0, 92, False)]
    prompt.num_computed += 92
    counters = StepCounters()
    rules = StepRules((), 1000, saves=True, blob_bound=True)
    assert save_long_prefill(prompt, rules, counters) == Save(0, tuple(range(92)), "")
    assert counters.num_checkpoints == 1 and prompt.checkpoints == []
    chunks, _ = s.schedule()
    assert [(c.start, c.length, c.sample) for c in chunks] == [(92, 8, True)]
    prompt.num_computed += 8  # and the whole prompt's state is saved once it is in
    assert save_long_prefill(prompt, rules, counters) == Save(0, tuple(range(100)), "")


def test_no_tail_checkpoint_without_exact_reuse_or_a_cache() -> None:
    for config in (
        SchedulerConfig(
            1, 1000, 1000, 512, 256, exact=False, whole_state=True, checkpoint_tokens=32
        ),  # fmt: skip
        SchedulerConfig(
            1,
            1000,
            1000,
            512,
            256,
            exact=True,
            exact_min_rows=8,
            whole_state=True,
            checkpoint_tokens=0,
        ),  # fmt: skip
    ):
        s = Scheduler(config)
        prompt = seq_of("prompt", list(range(100)))
        s.add(prompt)
        s.schedule()
        assert prompt.checkpoints == []


def test_the_lookup_asks_only_for_states_the_prompt_can_start_from() -> None:
    exact = whole(exact=True).config
    # A proper prefix of the first 93 tokens: at most 92, the reuse limit of 100.
    assert lookup_reach(100, exact) == 93
    assert lookup_reach(5, exact) == 0  # the whole prompt is recomputed
    assert lookup_reach(100, whole(exact=False).config) == 100
    plain = SchedulerConfig(1, 1000, 1000, 512, 256, exact=True, exact_min_rows=8)
    assert lookup_reach(100, plain) == 100  # attention cuts a longer entry back itself


def test_an_exact_extension_starts_from_the_tail_checkpoint() -> None:
    s = whole(exact=True)
    prompt = list(range(100))
    turn = seq_of("turn", [*prompt, *range(200, 220)])  # the same prompt and 20 ids more
    turn.cache_hit = CacheHit(tuple(prompt[: 100 - ROWS]), b"x", 92, "disk")
    s.add(turn)
    _, kv = s.schedule()
    assert any(isinstance(op, Restore) and op.keep == 92 for op in kv.ops)
    assert turn.num_cached == 92 and turn.hit_source == "disk" and turn.cold_reason == ""


def test_a_request_that_found_a_prefix_but_reused_none_says_why() -> None:
    s = whole(exact=True)
    prompt = list(range(100))
    near = seq_of("near", [*prompt, 1, 2])  # the stored state ends 2 rows from its end
    near.cache_hit = CacheHit(tuple(prompt), b"x", 100, "ram")
    s.add(near)
    s.schedule()
    assert near.hit_kind == "cold" and near.cold_reason == "exact_tail"

    s = holding_first()  # a slot holding a 100-token state, of which 70 are shared
    second = seq_of("second", list(range(70)) + [500] * 30)
    s.add(second)
    s.schedule()
    assert second.hit_kind == "cold" and second.cold_reason == "longer_state"

    s = whole(exact=True)
    fresh = seq_of("fresh", [900] * 100)  # nothing agreed with it: no reason to give
    s.add(fresh)
    s.schedule()
    assert fresh.hit_kind == "cold" and fresh.cold_reason == ""


def test_a_window_state_from_the_cache_serves_exact_reuse_when_it_extends_the_prompt() -> None:
    # Its blob goes in laid out as a cold sequence's cells (engine/thread/window_blob.py): a
    # state the prompt extends is restored whole; one it shares only part of is not.
    config = SchedulerConfig(1, 1000, 1000, 512, 256, exact=True, exact_min_rows=8, n_swa=32)
    assert config.saves_checkpoints
    s = Scheduler(config)
    prompt = list(range(100))
    seq = seq_of("seq", [*prompt, *range(200, 300)])
    seq.cache_hit = CacheHit(tuple(prompt), b"x", 100, "ram")
    s.add(seq)
    _, kv = s.schedule()
    assert any(isinstance(op, Restore) and op.keep == 100 for op in kv.ops)
    assert seq.num_cached == 100 and seq.kv_floor == 99
    s.remove(seq)
    other = seq_of("other", [*prompt[:60], *range(300, 400)])
    other.cache_hit = CacheHit(tuple(prompt), b"x", 60, "ram")
    s.add(other)
    s.schedule()
    assert other.hit_kind == "cold" and other.cold_reason == "window"


def test_a_prompt_diverging_from_a_recent_one_saves_the_shared_head() -> None:
    # Exact reuse on a whole state keeps no slot once decoded and the lookup returns only
    # usable states, so the placer remembers recent prompts: the second agent on one
    # system prompt saves the state at the head's last block, the third restores it.
    s = whole(exact=True)
    head = list(range(64))
    first = seq_of("first", [*head, *[500] * 60])
    s.add(first)
    finish(s, first)
    second = seq_of("second", [*head, *[600] * 60])
    s.add(second)
    s.schedule()
    assert second.checkpoints == [64, 124 - ROWS]
