"""Prompt-lookup drafting (engine/speculation.py) and how the scheduler sizes drafts."""

from __future__ import annotations

from engine.detokenizer import IncrementalDetokenizer
from engine.sequence import Sequence
from engine.speculation import DRAFT_MAX, DRAFT_START, MISSES_BEFORE_PAUSE, PAUSE_STEPS, Drafter
from engine.thread.scheduler import Scheduler, SchedulerConfig
from engine.types import GenerateRequest


def test_proposes_what_followed_the_last_ngram_before() -> None:
    tokens = [1, 2, 3, 4, 5, 6, 9, 2, 3]
    assert Drafter().propose(tokens, 8) == (4, 5, 6, 9)[:DRAFT_START]


def test_the_longest_ngram_wins_and_the_latest_occurrence() -> None:
    # (2, 3) occurs twice; (7, 2, 3) only at the start: the 3-gram match is taken.
    tokens = [7, 2, 3, 10, 11, 0, 2, 3, 20, 21, 7, 2, 3]
    assert Drafter().propose(tokens, 2) == (10, 11)
    # Without a 3-gram match the latest 2-gram occurrence is used.
    tokens = [5, 2, 3, 10, 11, 0, 2, 3, 20, 21, 8, 2, 3]
    assert Drafter().propose(tokens, 2) == (20, 21)


def test_no_match_and_no_self_match() -> None:
    assert Drafter().propose([1, 2, 3, 4], 8) == ()
    assert Drafter().propose([1, 1], 8) == ()  # the trailing n-gram never finds itself


def test_limit_caps_the_draft_and_zero_drafts_nothing() -> None:
    tokens = [1, 2, 3, 4, 5, 6, 1, 2]
    assert Drafter().propose(tokens, 1) == (3,)
    assert Drafter().propose(tokens, 0) == ()


def test_index_grows_with_the_sequence() -> None:
    drafter = Drafter()
    tokens = [1, 2, 3, 4]
    assert drafter.propose(tokens, 8) == ()
    tokens += [5, 1, 2]
    assert drafter.propose(tokens, 8) == (3, 4, 5, 1)
    assert drafter.num_indexed == len(tokens)


def test_feedback_grows_shrinks_and_pauses() -> None:
    drafter = Drafter()
    drafter.feedback(DRAFT_START, DRAFT_START)
    assert drafter.length == 2 * DRAFT_START
    for _ in range(10):
        drafter.feedback(drafter.length, drafter.length)
    assert drafter.length == DRAFT_MAX
    drafter.feedback(DRAFT_MAX, 3)
    assert drafter.length == 4
    for _ in range(MISSES_BEFORE_PAUSE):
        drafter.feedback(4, 0)
    assert drafter.paused == PAUSE_STEPS
    tokens = [1, 2, 3, 1, 2]
    for _ in range(PAUSE_STEPS):
        assert drafter.propose(tokens, 8) == ()
    assert drafter.propose(tokens, 8) == (3, 1, 2)[:DRAFT_START]


# -- the scheduler's side: which decode rows carry drafts, and how many ----------------

REPEATING = (1, 2, 3, 4, 5, 6, 7, 8) * 4  # any suffix recurs: a draft is always found


def decoding(
    name: str, *, max_tokens: int | None = None, speculative: bool | None = None
) -> Sequence:
    request = GenerateRequest(name, REPEATING, max_tokens=max_tokens, speculative=speculative)
    seq = Sequence(request, None, IncrementalDetokenizer([b""]), None)
    return seq


def first_decode(s: Scheduler, seq: Sequence) -> tuple[int, ...]:
    """Prefill `seq`, sample one token as the worker would, and plan its first decode."""
    s.add(seq)
    chunks, _ = s.schedule()
    for c in chunks:
        c.seq.num_computed += c.length
    seq.tokens.append(1)  # the sampled token: REPEATING continues with 2, 3, ...
    chunks, _ = s.schedule()
    (chunk,) = chunks
    assert chunk.length == 1 + len(chunk.draft) and chunk.start == len(seq.tokens) - 1
    return chunk.draft


def sched(*, speculative: bool = True, n_ctx: int = 1000, step: int = 64) -> Scheduler:
    return Scheduler(
        SchedulerConfig(2, n_ctx, n_ctx, step, 64, exact=False, speculative=speculative)
    )


def test_a_decoding_sequence_carries_a_draft() -> None:
    assert first_decode(sched(), decoding("a")) == (2, 3, 4, 5)


def test_drafts_follow_the_config_unless_the_request_says() -> None:
    assert first_decode(sched(speculative=False), decoding("a")) == ()
    assert first_decode(sched(speculative=False), decoding("a", speculative=True)) != ()
    assert first_decode(sched(), decoding("a", speculative=False)) == ()


def test_a_draft_never_runs_past_max_tokens_or_the_context() -> None:
    # One token is out, max_tokens 3: at most two more, the last of them sampled.
    assert first_decode(sched(), decoding("a", max_tokens=3)) == (2,)
    assert first_decode(sched(), decoding("b", max_tokens=2)) == ()
    # 33 tokens in a 35-cell context: one more position fits beside the pending token.
    assert first_decode(sched(n_ctx=35), decoding("c")) == (2,)


def test_drafts_stay_within_the_step_budget() -> None:
    s = sched(step=12)
    a, b = decoding("a"), decoding("b")
    s.add(a)
    s.add(b)
    while not (a.is_decoding and b.is_decoding):  # prefill both, sampling as the worker
        chunks, _ = s.schedule()
        for c in chunks:
            c.seq.num_computed += c.length - len(c.draft)  # drafts rejected
            if c.sample:  # the pattern goes on, so drafts keep finding it
                c.seq.tokens.append(len(c.seq.tokens) % 8 + 1)
    for seq in (a, b):
        seq.drafter = Drafter()
        seq.drafter.length = DRAFT_MAX
    chunks, _ = s.schedule()
    # Two decode rows, and the 10 left shared out oldest first: a's 8 (what follows the
    # latest occurrence of its last n-gram), then 2 for b.
    assert [(c.seq, len(c.draft)) for c in chunks] == [(a, 8), (b, 2)]
