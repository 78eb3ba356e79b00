"""The thinking budget's policy, without a model: counting, the forced close, budget 0,
grammars, limits, UTF-8, drafts (engine/thinking.py, engine/thread/postprocess.py, the
scheduler's sample flag and draft room)."""

from __future__ import annotations

from engine.detokenizer import IncrementalDetokenizer
from engine.sequence import SeqStatus, Sequence
from engine.thinking import UNLIMITED, ThinkingBudget, ThinkingSpec, constrained_from_start
from engine.thread.postprocess import Action, Emit, End, Force, StepRules, postprocess
from engine.thread.runner import Sampled, StepResult
from engine.thread.scheduler import Chunk, Scheduler, SchedulerConfig
from engine.thread.stats import StepCounters
from engine.types import FinishReason, GenerateRequest, SeqOutput

# Tokens 0-25 are the letters; then the tags, a close of three tokens, and the two
# halves of "é".
PIECES = [bytes([ord("a") + i]) for i in range(26)]
EOG, OPEN, SLASH, THINK, GT, E1, E2 = range(26, 33)
PIECES += [b"", b"<think>", b"</", b"think", b">", b"\xc3", b"\xa9"]
CLOSE = (SLASH, THINK, GT)
A, B, C, D = 0, 1, 2, 3


def spec(budget: int | None, *, inside: bool = True) -> ThinkingSpec:
    return ThinkingSpec((OPEN,), CLOSE, inside, budget)


def running(
    budget: int | None, *, inside: bool = True, max_tokens: int | None = None, default: int = -1
) -> Sequence:
    thinking = spec(budget, inside=inside)
    request = GenerateRequest("r", (A, B, C), max_tokens=max_tokens, thinking=thinking)
    detok = IncrementalDetokenizer(PIECES)
    seq = Sequence(request, None, detok, None, ThinkingBudget.of(thinking, default=default,
                                                                 free=True))  # fmt: skip
    seq.status, seq.slot = SeqStatus.RUNNING, 0
    return seq


RULES = StepRules(frozenset({EOG}), 4096)


def step(seq: Sequence, token: int | None, *, grammar_on: bool = False) -> list[Action]:
    """Compute the pending tokens (the prompt, or what was appended) and sample `token`
    at their end (None: a chunk that does not sample)."""
    chunk = Chunk(seq, seq.num_computed, seq.num_pending, sample=token is not None)
    sampled = [Sampled(seq, token, None, grammar_on=grammar_on)] if token is not None else []
    return postprocess([chunk], StepResult(sampled, []), RULES, StepCounters()).actions


def text(actions: list[Action]) -> str:
    return "".join(a.output.text if isinstance(a, Emit) else a.text
                   for a in actions if isinstance(a, (Emit, End)))  # fmt: skip


def test_the_close_is_forced_after_budget_tokens_then_the_answer_follows() -> None:
    seq = running(3)
    assert step(seq, A) == [Emit(seq, SeqOutput("a", (A,)))]
    step(seq, B)
    actions = step(seq, C)
    assert actions == [Force(seq, CLOSE), Emit(seq, SeqOutput("c</think>", (C, *CLOSE)))]
    assert seq.tokens[-4:] == [C, *CLOSE] and seq.num_pending == 4  # computed next step
    assert seq.thinking is not None and not seq.thinking.inside
    assert text(step(seq, D)) == "d"  # the answer: nothing more is forced
    assert text(step(seq, A)) == "a"
    assert seq.thinking.num_tokens == 3 + len(CLOSE)


def test_a_close_the_model_wrote_itself_is_not_forced() -> None:
    seq = running(5)
    for token in (A, *CLOSE, B, C, D, A, B):
        assert not any(isinstance(a, Force) for a in step(seq, token))
    assert seq.thinking is not None and seq.thinking.num_tokens == 1 + len(CLOSE)


def test_a_close_begun_when_the_budget_runs_out_is_completed() -> None:
    seq = running(2)
    step(seq, A)
    actions = step(seq, SLASH)  # the second token, the close's first
    assert actions[0] == Force(seq, (THINK, GT))
    assert text(actions) == "</think>"


def test_budget_zero_inside_closes_before_anything_is_sampled() -> None:
    seq = running(0)
    assert seq.close_due == CLOSE
    s = Scheduler(SchedulerConfig(2, 100, 100, 64, 64, exact=False))
    s.add(seq)
    seq.status, seq.slot = SeqStatus.WAITING, None
    (chunk,), _ = s.schedule()
    assert chunk.length == 3 and not chunk.sample  # the prompt, not sampled
    actions = step(seq, None)
    assert actions[0] == Force(seq, CLOSE) and text(actions) == "</think>"
    assert seq.num_output_tokens == 3 and seq.close_due == ()
    assert text(step(seq, A)) == "a"  # then the answer is sampled after the close


def test_budget_zero_outside_closes_right_after_the_model_opens() -> None:
    seq = running(0, inside=False)
    assert text(step(seq, A)) == "a"
    actions = step(seq, OPEN)
    assert actions[0] == Force(seq, CLOSE) and text(actions) == "<think></think>"


def test_a_new_block_gets_a_fresh_budget() -> None:
    seq = running(1)
    assert text(step(seq, A)) == "a</think>"
    step(seq, B)
    actions = step(seq, OPEN)
    assert not any(isinstance(a, Force) for a in actions)  # opened, nothing used yet
    assert text(step(seq, C)) == "c</think>"


def test_unlimited_and_default_budgets() -> None:
    seq = running(None, default=UNLIMITED)
    for token in (A, B, C, D) * 5:
        assert not any(isinstance(a, Force) for a in step(seq, token))
    assert seq.thinking is not None and seq.thinking.num_tokens == 20
    seq = running(None, default=1)  # the engine's default applies to a request with none
    assert text(step(seq, A)) == "a</think>"


def test_a_grammar_that_constrains_gets_nothing_forced() -> None:
    seq = running(1)
    actions = step(seq, A, grammar_on=True)  # a lazy grammar that has triggered
    assert not any(isinstance(a, Force) for a in actions)
    assert constrained_from_start("root ::= x", False)
    assert not constrained_from_start("root ::= x", True)  # lazy: free until it triggers
    assert not constrained_from_start(None, False)
    counted = ThinkingBudget.of(spec(0), default=UNLIMITED, free=False)
    assert counted is not None and counted.due() == ()  # counted only, never forced


def test_a_close_past_max_tokens_ends_the_sequence_with_length() -> None:
    seq = running(2, max_tokens=4)  # 2 thinking tokens + a 3-token close would be 5
    step(seq, A)
    actions = step(seq, B)
    assert actions == [End(seq, FinishReason.LENGTH, "b", (B,))]


def test_a_character_in_progress_is_finished_before_the_close() -> None:
    seq = running(1)
    assert step(seq, E1) == [Emit(seq, SeqOutput("", (E1,)))]  # spent, "é" half out
    assert text(step(seq, E2)) == "é</think>"


def test_drafts_leave_the_budget_to_the_steps_last_token() -> None:
    budget = ThinkingBudget(spec(5), 5)
    assert budget.draft_room() == 4
    budget.accept(A)
    budget.accept(B)
    assert budget.draft_room() == 2
    outside = ThinkingBudget(spec(3, inside=False), 3)
    assert outside.draft_room() == 3  # the opening, then three tokens
    assert ThinkingBudget(spec(0, inside=False), 0).draft_room() == 0
    assert ThinkingBudget(spec(-1), -1).draft_room() is None


def test_the_scheduler_caps_a_draft_by_the_budget_left() -> None:
    from tests.engine.test_speculation import REPEATING, first_decode, sched

    thinking = spec(3)
    request = GenerateRequest("a", REPEATING, thinking=thinking)
    seq = Sequence(request, None, IncrementalDetokenizer([b""]), None,
                   ThinkingBudget(thinking, 3))  # fmt: skip
    assert first_decode(sched(), seq) == (2, 3)  # uncapped: (2, 3, 4, 5)
