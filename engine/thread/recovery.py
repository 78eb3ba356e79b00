"""Keeping requests bounded in time, and the engine thread's death survivable.

- `overdue`: each step, sequences past a per-request time limit end with an error
  naming it (the server answers 504) and free their slots.
- `abandon`: the engine thread died (engine.py rebuilds a worker): every request in
  flight, queued or still in the command queue fails at once, naming the cause,
  without touching llama.cpp state (it may be what broke).

Functions of plain state (no worker): the worker calls them and runs what they decide.
The counters need no carrying over: the rebuilt worker counts into the same
`StepCounters` (engine/thread/stats.py).
"""

from __future__ import annotations

import queue
from collections.abc import Iterable

from engine.commands import Command, Embed, Fork, Stop, Submit
from engine.sequence import Sequence
from engine.thread.embedder import Embedder
from engine.types import ENGINE_RESTARTED, FinishReason, SeqOutput, TimeLimits, coded_error

Output = tuple[object, SeqOutput]  # (the sequence's sink, what it receives)


def overdue(seqs: Iterable[Sequence], limits: TimeLimits, now: float) -> list[tuple[Sequence, str]]:
    """The sequences past one of their time limits, each with the error naming it."""
    lim, late = limits, []
    for seq in seqs:
        if lim.total_s and now - seq.arrival > lim.total_s:
            code, limit = "total_timeout", lim.total_s
        elif seq.t_first_token is None and lim.prefill_s and now - seq.arrival > lim.prefill_s:
            code, limit = "prefill_timeout", lim.prefill_s
        elif seq.t_last_token is not None and lim.token_s and now - seq.t_last_token > lim.token_s:
            code, limit = "token_timeout", lim.token_s
        else:
            continue
        message = f"the request ran past its {code.split('_')[0]} time limit ({limit:g} s)"
        late.append((seq, coded_error(code, message)))
    return late


def abandon(
    seqs: Iterable[Sequence],
    commands: queue.SimpleQueue[Command],
    embedder: Embedder | None,
    cause: str,
) -> tuple[list[Output], bool]:
    """The thread died (engine.py rebuilds it): fail every request at once, touching
    no llama.cpp state (it may be what broke). Commands not taken yet fail too.
    Returns the outputs to deliver, and whether a Stop was among the commands."""
    error = coded_error(ENGINE_RESTARTED, f"the engine failed and was restarted ({cause})")
    outputs = [failed(seq, error) for seq in seqs]
    stop = False
    while True:
        try:
            command = commands.get_nowait()
        except queue.Empty:
            break
        if isinstance(command, Submit):
            outputs += [failed(seq, error) for seq in command.seqs]
        elif isinstance(command, Embed):
            command.job.on_done(None, error)
        elif isinstance(command, Fork):
            command.on_done(0, error)
        elif isinstance(command, Stop):
            stop = True
    if embedder is not None:
        while embedder.jobs:
            embedder.jobs.popleft().on_done(None, error)
    return outputs, stop


def failed(seq: Sequence, error: str) -> Output:
    """The final output of a sequence failed without its bookkeeping (which may be
    what is broken); its sampler is freed."""
    if seq.sampler is not None:
        seq.sampler.close()
    output = SeqOutput(
        "",
        (),
        finish_reason=FinishReason.ERROR,
        num_prompt_tokens=seq.num_prompt_tokens,
        num_output_tokens=seq.num_output_tokens,
        error=error,
    )
    return seq.sink, output
