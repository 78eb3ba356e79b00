"""Outputs held back for a reader that wants the whole reply, not each token.

A streamed reply needs every token at once. A non-streamed one is read whole at its end
(server/serving/drive.py `collect`), yet each token handed over still wakes the event
loop: at one sequence of SmolLM2 on two cores, 0.28 ms of the loop's CPU a token (0.09
held), and 0.1-0.2 ms more between two 12 ms decodes, since the GIL runs the loop's
Python there while llama.cpp's second thread spins (docs/benchmarks.md). A held
sequence's outputs are merged here instead and handed over with the first token (its
time to first token stays measured), then at most every `HOLD_S` (the status page's and
the metrics' token counts stay live), and at its end. What reaches the reader is the
same text, tokens and totals. The merge is the engine's copy of what the reader's
`Choice.add` does with two outputs in turn: the engine may not import the server.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from engine.sequence import Sequence
from engine.types import SeqOutput

HOLD_S = 0.5


def merged(first: SeqOutput, then: SeqOutput) -> SeqOutput:
    """`first` followed by `then`, as one output: a reader adding the two in turn
    (server/serving/state.py `Choice.add`) ends with what it gets from this one."""
    return merged_all([first, then])


def merged_all(outputs: list[SeqOutput], **changes: Any) -> SeqOutput:
    """`outputs` (at least one) in turn, as one output, made in one go (the lane merges
    every token it wrote: engine/thread/lanes.py). The prompt's split is the last one
    an output carried (a later output without one keeps it). `changes` apply to the
    result, as in dataclasses.replace."""
    last = outputs[-1]
    if len(outputs) == 1:
        return dataclasses.replace(last, **changes)
    split = next(
        (o for o in reversed(outputs) if o.num_prompt_tokens or o.finish_reason is not None),
        outputs[0],
    )
    return dataclasses.replace(
        last,
        text="".join(o.text for o in outputs),
        token_ids=tuple(t for o in outputs for t in o.token_ids),
        logprobs=tuple(lp for o in outputs for lp in o.logprobs),
        prompt_logprobs=tuple(lp for o in outputs for lp in o.prompt_logprobs),
        num_prompt_tokens=split.num_prompt_tokens,
        num_cached_tokens=split.num_cached_tokens,
        **changes,
    )


def release(seq: Sequence, output: SeqOutput, now: float) -> SeqOutput | None:
    """What to hand over at `now` (time.monotonic()) for a held sequence, with what it
    held before, or None: `output` is held. The finish, the first output with a token,
    and any output `HOLD_S` after the last one handed over go out."""
    if seq.held is not None:
        output = merged(seq.held, output)
        seq.held = None
    if output.finish_reason is not None:
        return output
    if seq.t_released is None:
        if output.token_ids:
            seq.t_released = now
            return output
    elif now - seq.t_released >= HOLD_S:
        seq.t_released = now
        return output
    seq.held = output
    return None
