"""End-of-generation, stop strings, length and long-prefill saves, without a model."""

from __future__ import annotations

from engine.detokenizer import IncrementalDetokenizer
from engine.sequence import SeqStatus, Sequence
from engine.speculation import Drafter
from engine.thread.postprocess import (
    SAVE_EVERY_TOKENS,
    SAVE_PROMPT_MIN_TOKENS,
    Action,
    Emit,
    End,
    StepRules,
    postprocess,
)
from engine.thread.runner import Sampled, StepResult
from engine.thread.scheduler import Chunk
from engine.thread.slots import Drop, Save
from engine.thread.stats import StepCounters
from engine.types import FinishReason, GenerateRequest, SamplingParams, SeqOutput, TokenLogprob

# A vocabulary of one-character pieces: token i is chr(ord("a") + i); 26 is EOG.
PIECES = [bytes([ord("a") + i]) for i in range(26)] + [b""]
EOG = 26


def running(
    num_prompt: int = 4,
    *,
    max_tokens: int | None = None,
    stop: tuple[str, ...] = (),
    ignore_eos: bool = False,
    slot: int = 0,
) -> Sequence:
    request = GenerateRequest(
        "r",
        tuple(range(num_prompt)),
        max_tokens=max_tokens,
        stop=stop,
        sampling=SamplingParams(ignore_eos=ignore_eos),
    )
    seq = Sequence(request, None, IncrementalDetokenizer(PIECES, stop), None)
    seq.status, seq.slot = SeqStatus.RUNNING, slot
    return seq


def rules(n_ctx_seq: int = 4096, saves: bool = True) -> StepRules:
    return StepRules(frozenset({EOG}), n_ctx_seq, saves)


def prefill(seq: Sequence, token: int | None = None, r: StepRules | None = None) -> list[Action]:
    """The whole prompt in one chunk; sampling `token` at its end unless None."""
    chunk = Chunk(seq, 0, seq.num_prompt_tokens, sample=token is not None)
    sampled = [Sampled(seq, token, None)] if token is not None else []
    return postprocess([chunk], StepResult(sampled, []), r or rules(), StepCounters()).actions


def decode(seq: Sequence, token: int | None, r: StepRules | None = None) -> list[Action]:
    """One decode row: the pending (last sampled) token in, `token` sampled."""
    chunk = Chunk(seq, seq.num_computed, 1, sample=True)
    result = StepResult([Sampled(seq, token, None)], [])
    return postprocess([chunk], result, r or rules(), StepCounters()).actions


def test_a_token_becomes_text() -> None:
    seq = running()
    [action] = prefill(seq, 7)
    assert isinstance(action, Emit) and action.output.text == "h"
    assert action.output.token_ids == (7,) and seq.tokens[-1] == 7


def test_end_of_generation_stops_without_its_text() -> None:
    seq = running()
    prefill(seq, 0)
    [action] = decode(seq, EOG)
    assert action == End(seq, FinishReason.STOP, "")


def test_ignore_eos_goes_past_end_of_generation() -> None:
    seq = running(ignore_eos=True)
    [action] = prefill(seq, EOG)
    assert isinstance(action, Emit)


def test_a_stop_string_ends_with_the_text_before_it() -> None:
    seq = running(stop=("cd",))
    assert prefill(seq, 1) == [Emit(seq, SeqOutput("b", (1,)))]  # no stop prefix
    assert decode(seq, 2) == [Emit(seq, SeqOutput("", (2,)))]  # "c" may begin "cd": held
    [action] = decode(seq, 3)
    assert isinstance(action, End) and action.reason is FinishReason.STOP
    assert action.text == "" and action.token_ids == (3,)
    assert seq.detokenizer.matched == "cd"


def test_max_tokens_ends_with_length_and_flushes_held_text() -> None:
    seq = running(max_tokens=2, stop=("xyz",))
    assert isinstance(prefill(seq, 0)[0], Emit)
    [action] = decode(seq, 23)  # "x" is held back as a stop prefix, then flushed
    assert isinstance(action, End) and action.reason is FinishReason.LENGTH
    assert action.text == "x" and action.token_ids == (23,)


def test_the_context_size_ends_with_length() -> None:
    seq = running(num_prompt=4)
    assert isinstance(prefill(seq, 0, rules(n_ctx_seq=6))[0], Emit)  # 5 tokens: room for 1
    [action] = decode(seq, 0, rules(n_ctx_seq=6))
    assert isinstance(action, End) and action.reason is FinishReason.LENGTH


def test_a_grammar_that_admits_nothing_ends_with_stop() -> None:
    seq = running()
    prefill(seq, 0)
    [action] = decode(seq, None)
    assert action == End(seq, FinishReason.STOP, "")
    assert len(seq.tokens) == 5  # nothing appended


def test_max_tokens_zero_only_scores_the_prompt() -> None:
    seq = running(max_tokens=0)
    actions = prefill(seq)  # the scheduler samples nothing for max_tokens 0
    assert actions == [End(seq, FinishReason.LENGTH, "")]


def test_a_rejected_draft_drops_its_kv_and_tokens_after_the_end_are_ignored() -> None:
    seq = running(max_tokens=1)
    seq.tokens.append(5)  # decoding: the pending token
    seq.num_computed = 4
    seq.drafter = Drafter()
    chunk = Chunk(seq, 4, 3, sample=True, draft=(6, 7))
    result = StepResult(
        [Sampled(seq, 6, None), Sampled(seq, 7, None, after_draft=True)], [], [(seq, 2, 1)]
    )
    counters = StepCounters()
    out = postprocess([chunk], result, rules(), counters)
    # The one accepted guess stays; the second is dropped. max_tokens 1 was reached by
    # the first sampled token (5 was already output), so the second is never appended.
    assert out.actions[0] == Drop(0, 5 + 1, seq)
    assert isinstance(out.actions[1], End) and out.actions[1].reason is FinishReason.LENGTH
    assert len(out.actions) == 2 and seq.tokens[-1] == 6
    assert (counters.num_drafted_tokens, counters.num_accepted_tokens) == (2, 1)
    assert out.num_tokens == 3 and counters.num_steps == 1


def test_a_long_prefill_is_saved_along_the_way() -> None:
    seq = running(num_prompt=SAVE_EVERY_TOKENS + 10, slot=2)
    chunk = Chunk(seq, 0, SAVE_EVERY_TOKENS, sample=False)
    actions = postprocess([chunk], StepResult([], []), rules(), StepCounters()).actions
    assert actions == [Save(2, tuple(seq.tokens[:SAVE_EVERY_TOKENS]), seq.salt)]
    assert seq.num_saved == SAVE_EVERY_TOKENS
    chunk = Chunk(seq, SAVE_EVERY_TOKENS, 9, sample=False)  # 9 more: too few to save
    assert postprocess([chunk], StepResult([], []), rules(), StepCounters()).actions == []


def test_a_finished_prompt_is_saved_once_long_enough_and_not_without_a_cache() -> None:
    seq = running(num_prompt=SAVE_PROMPT_MIN_TOKENS)
    prompt = tuple(seq.tokens)
    assert prefill(seq, 0) == [Emit(seq, SeqOutput("a", (0,))), Save(0, prompt, seq.salt)]
    assert seq.num_saved == len(prompt)
    short = running(num_prompt=SAVE_PROMPT_MIN_TOKENS - 1)
    assert prefill(short, 0) == [Emit(short, SeqOutput("a", (0,)))]
    seq = running(num_prompt=SAVE_PROMPT_MIN_TOKENS)
    assert prefill(seq, 0, rules(saves=False)) == [Emit(seq, SeqOutput("a", (0,)))]
    assert seq.num_saved == 0


def test_a_state_not_to_be_cut_back_is_saved_at_the_prompt_end_however_little_is_new() -> None:
    # A sliding window or a whole state (blob_bound): the state after the reply does not
    # serve a next turn that parts inside the reply, so the prompt's end is saved even
    # when its last save (a checkpoint, SAVE_EVERY_TOKENS) lies only a few tokens before.
    window = StepRules(frozenset({EOG}), 4096, saves=True, blob_bound=True)
    for r, saved in ((window, True), (rules(), False)):
        seq = running(num_prompt=SAVE_EVERY_TOKENS + 203)
        seq.num_saved = SAVE_EVERY_TOKENS  # the last save, 203 tokens before the end
        seq.num_computed = SAVE_EVERY_TOKENS
        chunk = Chunk(seq, SAVE_EVERY_TOKENS, 203, sample=True)
        actions = postprocess([chunk], StepResult([Sampled(seq, 0, None)], []), r,
                              StepCounters()).actions  # fmt: skip
        save = Save(0, tuple(range(SAVE_EVERY_TOKENS + 203)), seq.salt)
        assert (save in actions) is saved
        assert seq.num_saved == (SAVE_EVERY_TOKENS + 203 if saved else SAVE_EVERY_TOKENS)


def test_prompt_logprobs_wait_for_the_worker_and_counters_count() -> None:
    seq = running(num_prompt=3)
    scored = [TokenLogprob(1, -0.5), TokenLogprob(2, -0.25)]
    chunk = Chunk(seq, 0, 3, sample=True)
    counters = StepCounters()
    result = StepResult([Sampled(seq, 4, TokenLogprob(4, -1.0))], [(seq, scored)])
    [action] = postprocess([chunk], result, rules(), counters).actions
    assert isinstance(action, Emit) and action.output.logprobs == (TokenLogprob(4, -1.0),)
    assert seq.prompt_logprobs == scored and seq.num_scored == 2
    assert counters.num_prefill_tokens == 3 and counters.num_generated_tokens == 1
    assert seq.t_prompt_done is not None and seq.t_first_token is not None
