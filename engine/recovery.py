"""Keeping requests bounded in time, and the engine thread's death survivable.

- `enforce_limits`: each step, sequences past a per-request time limit end with an
  error naming it (the server answers 504) and free their slots.
- `abandon`: the engine thread died (engine.py rebuilds a worker): every request in
  flight, queued or still in the command queue fails at once, naming the cause,
  without touching llama.cpp state (it may be what broke).

The counters need no carrying over: the rebuilt worker counts into the same
`StepCounters` (engine/stats.py).
"""

from __future__ import annotations

import queue
import time
from typing import TYPE_CHECKING

from engine.sequence import Sequence
from engine.types import ENGINE_RESTARTED, FinishReason, SeqOutput, coded_error

if TYPE_CHECKING:
    from engine.worker import Worker

def enforce_limits(worker: Worker) -> None:
    """End every sequence past one of its time limits (its slot is freed)."""
    lim, now = worker.limits, time.monotonic()
    for seq in list(worker.scheduler.running) + list(worker.scheduler.waiting):
        if lim.total_s and now - seq.arrival > lim.total_s:
            code, limit = "total_timeout", lim.total_s
        elif seq.t_first_token is None and lim.prefill_s and now - seq.arrival > lim.prefill_s:
            code, limit = "prefill_timeout", lim.prefill_s
        elif seq.t_last_token is not None and lim.token_s and now - seq.t_last_token > lim.token_s:
            code, limit = "token_timeout", lim.token_s
        else:
            continue
        worker.counters.num_timeouts += 1
        message = f"the request ran past its {code.split('_')[0]} time limit ({limit:g} s)"
        worker._finish(seq, FinishReason.ERROR, "", error=coded_error(code, message))


def abandon(worker: Worker, cause: str) -> None:
    """The thread died (engine.py rebuilds it): fail every request at once, touching
    no llama.cpp state (it may be what broke). Commands not taken yet fail too."""
    from engine.worker import Embed, Fork, Stop, Submit  # the commands; worker imports us

    error = coded_error(ENGINE_RESTARTED, f"the engine failed and was restarted ({cause})")
    for seq in list(worker.scheduler.running) + list(worker.scheduler.waiting):
        abandon_seq(worker, seq, error)
    while True:
        try:
            command = worker.commands.get_nowait()
        except queue.Empty:
            break
        if isinstance(command, Submit):
            for seq in command.seqs:
                abandon_seq(worker, seq, error)
        elif isinstance(command, Embed):
            command.job.on_done(None, error)
        elif isinstance(command, Fork):
            command.on_done(0, error)
        elif isinstance(command, Stop):
            worker._stopping = True
    if worker.embedder is not None:
        while worker.embedder.jobs:
            worker.embedder.jobs.popleft().on_done(None, error)
    out, worker._outbox = worker._outbox, []
    worker.deliver(out)


def abandon_seq(worker: Worker, seq: Sequence, error: str) -> None:
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
    worker._outbox.append((seq.sink, output))
