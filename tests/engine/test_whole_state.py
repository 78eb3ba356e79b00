"""Reuse on a whole-state memory (recurrent and hybrid models), without a model: a slot's
or the cache's state serves a prompt only when it was made from exactly a prefix of it,
nothing is ever cut back, and where prompts diverge a checkpoint is saved on the way."""

from __future__ import annotations

from cache import CacheHit
from engine.detokenizer import IncrementalDetokenizer
from engine.sequence import Sequence
from engine.thread.postprocess import StepRules, save_long_prefill
from engine.thread.scheduler import Scheduler, SchedulerConfig
from engine.thread.slots import Drop, Restore, Save
from engine.thread.stats import StepCounters
from engine.types import GenerateRequest


def seq_of(name: str, tokens: list[int]) -> Sequence:
    return Sequence(GenerateRequest(name, tuple(tokens)), None, IncrementalDetokenizer([b""]), None)


def whole(*, exact: bool = False, slots: int = 1) -> Scheduler:
    config = SchedulerConfig(slots, 1000 * slots, 1000, 512, 256, exact=exact,
                             exact_min_rows=8, whole_state=True, checkpoint_tokens=32)  # fmt: skip
    return Scheduler(config)


def finish(s: Scheduler, seq: Sequence) -> None:
    """Prefill `seq` whole (exact mode: in two chunks, the first to its tail checkpoint),
    sample one token, and take it out with its KV kept."""
    while seq.num_computed < seq.num_prompt_tokens:
        chunks, _ = s.schedule()
        assert chunks and chunks[0].seq is seq
        seq.num_computed += chunks[0].length
    seq.tokens.append(7)
    s.remove(seq)


def holding_first(*, exact: bool = False) -> Scheduler:
    """A scheduler whose one slot holds the state of a 100-token prompt, `first`."""
    s = whole(exact=exact)
    first = seq_of("first", list(range(100)))
    s.add(first)
    finish(s, first)  # the slot holds the 100 prompt tokens (the sampled one is not in)
    return s


def diverging(s: Scheduler) -> Sequence:
    """A prompt sharing 70 tokens with `first`, queued."""
    second = seq_of("second", list(range(70)) + [500] * 30)
    s.add(second)
    return second


def test_a_slot_holding_more_than_the_prompt_shares_is_not_cut_back() -> None:
    s = holding_first()
    second = diverging(s)
    chunks, kv = s.schedule()
    # Attention would keep 70 cells and drop the rest; a whole state cannot be cut there.
    assert kv.ops == [Drop(0, 0, second)] and second.num_computed == 0
    assert second.num_cached == 0 and second.hit_kind == "cold"


def test_a_slot_holding_exactly_a_prefix_of_the_prompt_is_reused() -> None:
    s = holding_first()
    turn = seq_of("turn", list(range(100)) + [7, 8, 9])
    s.add(turn)
    _, kv = s.schedule()
    assert kv.ops == [Drop(0, 100, turn)]  # keeps all of it: nothing to cut
    assert turn.num_cached == turn.num_computed == 100


def test_a_cache_hit_longer_than_the_reuse_limit_is_not_taken() -> None:
    s = whole(exact=True)  # exact_min_rows 8: the last 8 prompt tokens are computed again
    prompt = list(range(100))
    near = seq_of("near", prompt)
    near.cache_hit = CacheHit(tuple(prompt[:95]), b"x", 95, "ram")
    s.add(near)
    _, kv = s.schedule()
    assert not any(isinstance(op, Restore) for op in kv.ops) and near.num_computed == 0
    far = seq_of("far", [*prompt, 1])
    s.remove(near)
    far.cache_hit = CacheHit(tuple(prompt[:64]), b"x", 64, "ram")
    s.add(far)
    _, kv = s.schedule()
    assert any(isinstance(op, Restore) and op.keep == 64 for op in kv.ops)


def test_where_prompts_diverge_a_checkpoint_is_computed_to_and_saved() -> None:
    s = holding_first()
    # Shares 70 tokens with the slot's state: the next prompt with this head restores
    # the state saved at the block boundary at or below 70 (32-token blocks: 64).
    second = diverging(s)
    chunks, _ = s.schedule()
    assert second.checkpoint == 64
    assert [(c.start, c.length) for c in chunks] == [(0, 64)]  # stops at the checkpoint
    second.num_computed += 64
    counters = StepCounters()
    rules = StepRules((), 1000, saves=True, blob_bound=True)
    assert save_long_prefill(second, rules, counters) == Save(0, tuple(range(64)), "")
    assert counters.num_checkpoints == 1 and second.checkpoint == 0
    chunks, _ = s.schedule()
    assert [(c.start, c.length, c.sample) for c in chunks] == [(64, 36, True)]


def test_exact_mode_checkpoints_stay_within_what_the_prompt_may_reuse() -> None:
    # Where prompts diverge (on a block), and at the prompt's own reuse limit (the tail
    # checkpoint, 8 rows before the end), each a full-size chunk (8) from the other.
    for tokens, expected in (
        (list(range(36)) + [500] * 64, [32, 92]),  # 32 rows from the start, 68 to the end
        (list(range(40)) + [600] * 5, [37]),  # 32 lies within 8 of the tail's 37
        (list(range(30)) + [600] * 20, [42]),  # below the first block boundary: the tail
    ):
        s = holding_first(exact=True)
        later = seq_of("later", tokens)
        s.add(later)
        s.schedule()
        assert later.checkpoints == expected, tokens


def test_exact_mode_reuses_no_state_that_holds_decoded_tokens() -> None:
    s = whole(exact=True)
    first = seq_of("first", list(range(100)))
    s.add(first)
    s.schedule()
    first.num_computed = first.num_prompt_tokens  # in (exact: the tail checkpoint on the way)
    first.tokens.append(7)
    first.num_computed += 1  # the sampled token decoded: its state is past the prompt
    first.tokens.append(8)
    assert s.reusable(first) == []
    drop = s.remove(first)
    assert drop == Drop(0, 0)  # the whole state goes; the prompt's was saved at its end
