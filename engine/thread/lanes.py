"""A stream's lane: a plain token's bytes written to the client by the engine thread.

Handing each streamed token to the event loop costs more than the token's own Python:
on two cores that llama.cpp's threads fill, the loop's wake-up and the GIL changing
hands twice come out of the gap between two decodes (docs/benchmarks.md, "A token's
lane"). A stream whose next chunk is a function of the output alone (a chat stream of
plain text, n=1) opens a lane (`engine.lane.Lane`); each output of its sequence is
offered to the lane first, here on the engine thread, and only what the lane declines
goes to the loop, which sends it as always.

An output is offered only once the reader has sent everything it was handed before
(the lane's `paid` against the sequence's `num_unwritten`): outputs the loop has not
sent yet (the ones before the lane opened, the ones the lane declined) go first.

The reader still learns of every output: what the lane wrote is merged (as
engine/thread/holding.py merges) and handed over marked `written` before the next output
the lane declines (the finish always is), and at least every `holding.HOLD_S` so that
the reader's heartbeat, the status page and the metrics stay live. The reader folds a
written output into its totals and sends nothing for it.
"""

from __future__ import annotations

import logging

from engine.sequence import Sequence
from engine.thread import holding
from engine.thread.holding import HOLD_S, merged_all
from engine.thread.stats import StepCounters
from engine.types import SeqOutput

log = logging.getLogger("kvserve.engine")


def handed(
    seq: Sequence, output: SeqOutput, now: float, counters: StepCounters
) -> list[SeqOutput]:
    """What the reader of `seq` gets for `output`, in order: held back and merged for a
    reader of whole replies (engine/thread/holding.py), offered to a lane first, or as is."""
    if seq.holding:
        released = holding.release(seq, output, now)
        return [] if released is None else [released]
    if seq.lane is not None:
        return pass_on(seq, output, now, counters)
    seq.num_unwritten += 1
    return [output]


def pass_on(
    seq: Sequence, output: SeqOutput, now: float, counters: StepCounters
) -> list[SeqOutput]:
    """What to hand the reader of `seq` (which has a lane) for `output`, in order."""
    assert seq.lane is not None
    if seq.t_released is None:
        seq.t_released = now
    try:
        wrote = seq.lane.paid == seq.num_unwritten and seq.lane.offer(output)
    except Exception:  # a lane's bug must not cost the step: the loop sends from now on
        log.exception("a stream's lane failed; its outputs go through the event loop")
        seq.lane, wrote = None, False
    if wrote:
        counters.num_lane_writes += 1
        seq.passed.append(output)
        if now - seq.t_released < HOLD_S:
            return []
        return [_told(seq, now)]
    seq.num_unwritten += 1
    if not seq.passed:
        return [output]
    return [_told(seq, now), output]


def _told(seq: Sequence, now: float) -> SeqOutput:
    """What the lane wrote since the reader was last told, marked so."""
    told = merged_all(seq.passed, written=True)
    seq.passed, seq.t_released = [], now
    return told
