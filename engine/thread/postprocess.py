"""What one computed step means for its sequences: tokens in, actions out.

`postprocess` applies a step's sampled tokens to the sequences (token lists, computed
counts, text, stamps) and decides, without touching llama.cpp, the KV or the cache:
which outputs to send, which sequences end and why (end-of-generation, a stop string,
max_tokens or the context's size, a grammar that admits nothing more), which rejected
draft tokens' KV to drop, and which long prefills to save along the way. The worker
runs the returned actions in order, so the policy is testable without a model
(tests/engine/test_postprocess.py).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Collection
from dataclasses import dataclass, field

from engine.sequence import SeqStatus, Sequence
from engine.thread.runner import Sampled, StepResult
from engine.thread.scheduler import Chunk
from engine.thread.slots import Drop, Save
from engine.thread.stats import BATCH_SIZE_BOUNDS, StepCounters
from engine.types import FinishReason, SeqOutput, TokenLogprob

# A long cold prefill is saved to the cache along the way, so that another prompt
# sharing its head (or this one, after an abort or a restart) finds it warm.
SAVE_EVERY_TOKENS = 1024
SAVE_PROMPT_MIN_TOKENS = 256


@dataclass(frozen=True, slots=True)
class Emit:
    """Send `output` (more text of a running sequence)."""

    seq: Sequence
    output: SeqOutput


@dataclass(frozen=True, slots=True)
class End:
    """The sequence ends: the worker frees its slot (keeping what may be reused) and
    sends the final output with this text, these tokens and this reason."""

    seq: Sequence
    reason: FinishReason
    text: str
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class Force:
    """The worker feeds `tokens` to the sequence's sampler as if it had sampled them
    (penalties and a waiting grammar trigger see them): a thinking block's close,
    already appended to the sequence (engine/thinking.py)."""

    seq: Sequence
    tokens: tuple[int, ...]


Action = Emit | End | Force | Drop | Save


@dataclass(frozen=True, slots=True)
class StepRules:
    """What decides a sequence's end besides its request."""

    eog_ids: Collection[int]  # end-of-generation tokens of the model
    n_ctx_seq: int  # KV cells one sequence may use
    saves: bool = True  # a prefix cache takes long prefills along the way
    # A saved state serves only prompts that extend it (ModelFamily.blob_bound: a
    # recurrent or hybrid memory, a sliding window).
    blob_bound: bool = False


@dataclass(slots=True)
class StepOutcome:
    actions: list[Action] = field(default_factory=list)  # to run in this order
    num_tokens: int = 0  # rows the step computed (the batch-size gauge)


def postprocess(
    chunks: list[Chunk], result: StepResult, rules: StepRules, counters: StepCounters
) -> StepOutcome:
    """Apply one computed step to its sequences; return what the worker must do."""
    out = StepOutcome()
    ended: set[int] = set()  # id() of sequences an action of this step ends
    num_decode_rows = 0
    for chunk in chunks:
        out.num_tokens += chunk.length
        num_decode_rows += chunk.length if chunk.seq.is_decoding else 0
        # Draft rows count once accepted, token by token (below).
        chunk.seq.num_computed += chunk.length - len(chunk.draft)
        if chunk.seq.t_prompt_done is None and not chunk.seq.num_pending_prompt:
            chunk.seq.t_prompt_done = time.monotonic()
    counters.num_steps += 1
    counters.batch_size_counts[bisect.bisect_left(BATCH_SIZE_BOUNDS, out.num_tokens)] += 1
    counters.batch_size_sum += out.num_tokens
    counters.num_prefill_tokens += out.num_tokens - num_decode_rows
    for seq, logprobs in result.scored:
        seq.prompt_logprobs.extend(logprobs)
        seq.num_scored += len(logprobs)
    for seq, drafted, accepted in result.drafts:
        assert seq.drafter is not None and seq.slot is not None
        if accepted < drafted:  # the rejected guesses' KV (num_computed: the pending token's)
            out.actions.append(Drop(seq.slot, seq.num_computed + accepted, seq))
        seq.drafter.feedback(drafted, accepted)
        counters.num_drafted_tokens += drafted
        counters.num_accepted_tokens += accepted
    for item in result.sampled:
        if item.after_draft:
            if id(item.seq) in ended:
                continue  # it ended on an earlier token of this step (stop, EOG, length)
            item.seq.num_computed += 1
        action = append_token(item, rules, counters)
        actions: list[Action] = [action]
        # A grammar that constrains (a lazy one, triggered) owns the output: no close.
        if isinstance(action, Emit) and not item.grammar_on and item.seq.close_due:
            actions = force_close(item.seq, item.seq.close_due, action.output, rules)
        if isinstance(actions[-1], End):
            ended.add(id(item.seq))
        out.actions += actions
    for chunk in chunks:
        seq = chunk.seq
        if id(seq) in ended or seq.status is not SeqStatus.RUNNING:
            continue
        if seq.num_pending == 0:  # not sampled: max_tokens 0 (scored), or a close due first
            forced = seq.close_due
            actions = force_close(seq, forced, SeqOutput("", ()), rules) if forced else []
            if not actions or isinstance(actions[-1], End):
                ended.add(id(seq))
            out.actions += actions or [End(seq, FinishReason.LENGTH, "")]
        elif not chunk.sample or seq.num_output_tokens == 1:
            save = save_long_prefill(seq, rules, counters)
            if save is not None:
                out.actions.append(save)
    return out


def append_token(item: Sampled, rules: StepRules, counters: StepCounters) -> Emit | End:
    """Add one sampled token to its sequence: more text, or the sequence's end."""
    seq, token = item.seq, item.token
    if token is None:  # the grammar is complete (or admits nothing): it ends here
        return End(seq, FinishReason.STOP, seq.detokenizer.flush())
    seq.tokens.append(token)
    counters.num_generated_tokens += 1
    seq.t_last_token = time.monotonic()
    if seq.t_first_token is None:
        seq.t_first_token = seq.t_last_token
    if token in rules.eog_ids and not seq.request.sampling.ignore_eos:
        return End(seq, FinishReason.STOP, seq.detokenizer.flush())
    text = seq.detokenizer.push(token)
    logprobs = (item.logprob,) if item.logprob is not None else ()
    if seq.thinking is not None:
        seq.thinking.accept(token)
    if seq.detokenizer.stopped:
        return End(seq, FinishReason.STOP, text, (token,), logprobs)
    if out_of_room(seq, rules.n_ctx_seq):
        return End(seq, FinishReason.LENGTH, text + seq.detokenizer.flush(), (token,), logprobs)
    return Emit(seq, SeqOutput(text, (token,), logprobs))


def force_close(
    seq: Sequence, forced: tuple[int, ...], before: SeqOutput, rules: StepRules
) -> list[Action]:
    """The thinking budget is spent: append its close after `before` (this step's
    output so far) as if sampled: its text goes out, the sampler takes the tokens
    (`Force`), and the next step computes them and samples the answer's first token.
    A close that max_tokens or the context cannot hold, with one token after it, ends
    the sequence there (`length`): the limit cut the thinking. Forced tokens carry no
    logprobs (they were not sampled)."""
    limit = seq.request.max_tokens
    num_after = seq.num_output_tokens + len(forced)
    room = rules.n_ctx_seq - len(seq.tokens)
    if (limit is not None and num_after >= limit) or len(forced) >= room:
        text = before.text + seq.detokenizer.flush()
        return [End(seq, FinishReason.LENGTH, text, before.token_ids, before.logprobs)]
    assert seq.thinking is not None
    seq.tokens.extend(forced)
    seq.t_last_token = time.monotonic()
    if seq.t_first_token is None:
        seq.t_first_token = seq.t_last_token
    text = before.text
    for token in forced:
        seq.thinking.accept(token)
        text += seq.detokenizer.push(token)
        if seq.detokenizer.stopped:
            break
    token_ids = before.token_ids + forced
    if seq.detokenizer.stopped:  # a stop string in the close: it ends here, as sampled
        return [End(seq, FinishReason.STOP, text, token_ids, before.logprobs)]
    return [Force(seq, forced), Emit(seq, SeqOutput(text, token_ids, before.logprobs))]


def out_of_room(seq: Sequence, n_ctx_seq: int) -> bool:
    """max_tokens reached, or the context cannot hold another token."""
    limit = seq.request.max_tokens
    return (limit is not None and seq.num_output_tokens >= limit) or len(seq.tokens) >= n_ctx_seq


def save_long_prefill(seq: Sequence, rules: StepRules, counters: StepCounters) -> Save | None:
    """Save a long prompt's computed head every SAVE_EVERY_TOKENS (and once it is all
    in), so an abort, a restart or another prompt sharing it starts warm. Memories whose
    saved states cannot be cut back (whole states, sliding windows) also save at their
    checkpoint, and every prompt once it is in: a next turn that parts from the state at
    the end of the reply anywhere inside the reply (a template that renders it otherwise,
    a client that edits it or resends the prompt with another; and exact mode reuses no
    decoded token) then starts from the prompt's end, not from the last save up to
    SAVE_PROMPT_MIN_TOKENS before it."""
    if not rules.saves or seq.slot is None:
        return None
    done = min(seq.num_computed, seq.num_prompt_tokens)
    fresh = done - seq.num_saved
    prompt_done = done == seq.num_prompt_tokens
    while 0 < seq.checkpoint < done:  # passed by (a preempted sequence placed again)
        del seq.checkpoints[0]
    at_checkpoint = seq.checkpoint > 0 and done == seq.checkpoint
    if at_checkpoint:
        del seq.checkpoints[0]
        counters.num_checkpoints += 1
    least = 1 if rules.blob_bound else SAVE_PROMPT_MIN_TOKENS
    if fresh >= SAVE_EVERY_TOKENS or at_checkpoint or (prompt_done and fresh >= least):
        seq.num_saved = done
        return Save(seq.slot, tuple(seq.tokens[:done]), seq.salt)
    return None
