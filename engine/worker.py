"""The engine thread: owns the llama context and runs the step loop.

    while running:
        take commands (submit, abort, embed, stop)
        chunks = scheduler.schedule()      # policy
        sampled = runner.run(chunks)       # one llama_decode
        postprocess(chunks, sampled)       # tokens -> text -> outputs

Outputs of one step leave in one `deliver` call, so the event loop is woken once per
step rather than once per token.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.embedder import Embedder, EmbedJob
from engine.llama import Context, Model
from engine.runner import DecodeError, Runner, Sampled, StepResult
from engine.scheduler import Chunk, Scheduler
from engine.sequence import SeqStatus, Sequence
from engine.types import EngineStats, FinishReason, SeqOutput

log = logging.getLogger("kvserve.engine")

Deliver = Callable[[list[tuple[object, SeqOutput]]], None]

# Bucket bounds of the tokens-per-step histogram in `stats()`.
BATCH_SIZE_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)


@dataclass(frozen=True, slots=True)
class Submit:
    seqs: tuple[Sequence, ...]


@dataclass(frozen=True, slots=True)
class Abort:
    request_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Embed:
    job: EmbedJob


@dataclass(frozen=True, slots=True)
class Stop:
    pass


Command = Submit | Abort | Embed | Stop


class Worker:
    def __init__(
        self,
        model: Model,
        ctx: Context,
        scheduler: Scheduler,
        embedder: Embedder | None,
        deliver: Deliver,
    ):
        self.model = model
        self.ctx = ctx
        self.scheduler = scheduler
        self.runner = Runner(ctx, scheduler.config.step_tokens)
        self.embedder = embedder
        self.deliver = deliver
        self.commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._outbox: list[tuple[object, SeqOutput]] = []
        self._stopping = False
        self._eog = model.eog_ids
        self._n_ctx_seq = scheduler.config.n_ctx_seq
        # counters for stats(); plain ints, written by this thread only
        self.num_steps = 0
        self.num_prefill_tokens = 0
        self.num_generated_tokens = 0
        self.num_decode_failures = 0
        self.last_batch_size = 0
        self.batch_size_counts = [0] * (len(BATCH_SIZE_BOUNDS) + 1)
        self.batch_size_sum = 0

    # -- the loop ----------------------------------------------------------------------

    def run(self) -> None:
        while not self._stopping:
            busy = self.scheduler.has_work or (self.embedder is not None and self.embedder.has_work)
            self._take_commands(block=not busy)
            if self._stopping:
                break
            try:
                if self.embedder is not None and self.embedder.has_work:
                    self.embedder.step()
                if self.scheduler.has_work:
                    self.step()
            except Exception as exc:  # a bug must cost its requests, never the engine thread
                log.exception("engine step failed")
                self._fail_everything(f"internal engine error: {type(exc).__name__}: {exc}")
            if self._outbox:
                out, self._outbox = self._outbox, []
                self.deliver(out)
        self._abort_all()

    def _take_commands(self, *, block: bool) -> None:
        try:
            command = self.commands.get(timeout=None) if block else self.commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._apply(command)
            try:
                command = self.commands.get_nowait()
            except queue.Empty:
                return

    def _apply(self, command: Command) -> None:
        if isinstance(command, Submit):
            for seq in command.seqs:
                self.scheduler.add(seq)
        elif isinstance(command, Abort):
            for request_id in command.request_ids:
                found = self.scheduler.find(request_id)
                if found is not None:
                    self._finish(found, FinishReason.ABORT, "")
        elif isinstance(command, Embed):
            if self.embedder is None:
                command.job.on_done(None, "embeddings are disabled")
            else:
                self.embedder.jobs.append(command.job)
        elif isinstance(command, Stop):
            self._stopping = True

    # -- one step ----------------------------------------------------------------------

    def step(self) -> None:
        chunks, kv = self.scheduler.schedule()
        for src, dst in kv.copies:
            self.ctx.copy_seq(src, dst)
        for slot, start in kv.drops:
            self.ctx.remove_seq(slot, start)
        if not chunks:
            time.sleep(0.001)  # nothing runnable (cannot happen while invariants hold)
            return
        started = time.monotonic()
        try:
            result = self.runner.run(chunks)
        except DecodeError as exc:
            self._decode_failed(chunks, exc)
            return
        for chunk in chunks:  # stage times for the metrics
            if chunk.seq.t_scheduled is None:
                chunk.seq.t_scheduled = started
        self._postprocess(chunks, result)

    def _postprocess(self, chunks: list[Chunk], result: StepResult) -> None:
        num_tokens = num_decode_rows = 0
        for chunk in chunks:
            num_tokens += chunk.length
            num_decode_rows += chunk.seq.is_decoding
            chunk.seq.num_computed += chunk.length
            if chunk.seq.t_prompt_done is None and not chunk.seq.num_pending_prompt:
                chunk.seq.t_prompt_done = time.monotonic()
        self.num_steps += 1
        self.last_batch_size = num_tokens
        self.batch_size_counts[bisect.bisect_left(BATCH_SIZE_BOUNDS, num_tokens)] += 1
        self.batch_size_sum += num_tokens
        self.num_prefill_tokens += num_tokens - num_decode_rows
        for seq, logprobs in result.scored:
            seq.prompt_logprobs.extend(logprobs)
            seq.num_scored += len(logprobs)
        for item in result.sampled:
            self._append(item)
        for chunk in chunks:
            seq = chunk.seq
            if seq.num_pending == 0 and seq.status is SeqStatus.RUNNING:
                self._finish(seq, FinishReason.LENGTH, "")  # max_tokens 0: prompt scored

    def _append(self, item: Sampled) -> None:
        seq, token = item.seq, item.token
        seq.tokens.append(token)
        self.num_generated_tokens += 1
        if seq.t_first_token is None:
            seq.t_first_token = time.monotonic()
        request = seq.request
        if token in self._eog and not request.sampling.ignore_eos:
            self._finish(seq, FinishReason.STOP, seq.detokenizer.flush())
            return
        text = seq.detokenizer.push(token)
        logprobs = (item.logprob,) if item.logprob is not None else ()
        finish = None
        if seq.detokenizer.stopped:
            finish = FinishReason.STOP
        elif self._out_of_room(seq):
            finish = FinishReason.LENGTH
        if finish is None:
            self._emit(seq, SeqOutput(text, (token,), logprobs))
            return
        if finish is FinishReason.LENGTH:
            text += seq.detokenizer.flush()
        self._finish(seq, finish, text, (token,), logprobs)

    def _out_of_room(self, seq: Sequence) -> bool:
        """max_tokens reached, or the context cannot hold another token."""
        limit = seq.request.max_tokens
        return (limit is not None and seq.num_output_tokens >= limit) or len(
            seq.tokens
        ) >= self._n_ctx_seq

    def _emit(self, seq: Sequence, output: SeqOutput) -> None:
        if seq.prompt_logprobs:  # sent once, with the first output after the prompt
            output = dataclasses.replace(output, prompt_logprobs=tuple(seq.prompt_logprobs))
            seq.prompt_logprobs.clear()
        self._outbox.append((seq.sink, output))

    def _finish(
        self,
        seq: Sequence,
        reason: FinishReason,
        text: str,
        token_ids: tuple[int, ...] = (),
        logprobs: tuple = (),
        error: str | None = None,
    ) -> None:
        # A failed sequence's cells may be half-written: never offer them for reuse.
        slot = self.scheduler.remove(seq, keep_kv=reason is not FinishReason.ERROR)
        if slot is not None:
            self.ctx.remove_seq(slot)
        if seq.sampler is not None:
            seq.sampler.close()
        self._emit(
            seq,
            SeqOutput(
                text,
                token_ids,
                logprobs,
                finish_reason=reason,
                num_prompt_tokens=seq.num_prompt_tokens,
                num_cached_tokens=seq.num_cached,
                num_output_tokens=seq.num_output_tokens,
                error=error,
                timings=seq.timings(),
            ),
        )

    def _decode_failed(self, chunks: list[Chunk], exc: DecodeError) -> None:
        # The failed batch may have left cells behind: drop what it added.
        for chunk in chunks:
            if chunk.seq.slot is not None:
                self.ctx.remove_seq(chunk.seq.slot, chunk.start)
        if exc.code == 1 and len(self.scheduler.running) > 1:
            # Out of KV cells (fragmentation): make room and retry next step.
            self.ctx.remove_seq(self.scheduler.preempt_newest())
            log.warning("KV cache full; preempted the newest sequence")
            return
        self.num_decode_failures += 1
        log.error("%s; failing %d sequence(s)", exc, len(chunks))
        for seq in {id(c.seq): c.seq for c in chunks}.values():
            self._finish(seq, FinishReason.ERROR, "", error=str(exc))

    def _fail_everything(self, error: str) -> None:
        for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
            self._finish(seq, FinishReason.ERROR, "", error=error)
        if self.embedder is not None:
            while self.embedder.jobs:
                job = self.embedder.jobs.popleft()
                job.on_done(None, error)
            self.embedder.ctx.clear()
        self.ctx.clear()
        self.scheduler.resident.clear()

    def _abort_all(self) -> None:
        for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
            self._finish(seq, FinishReason.ABORT, "")
        if self.embedder is not None:
            while self.embedder.jobs:
                self.embedder.jobs[0].cancelled = True
                self.embedder.step()
        if self._outbox:
            self.deliver(self._outbox)
            self._outbox = []

    def stats(self) -> EngineStats:
        """Safe to call from another thread: reads plain ints and list lengths only."""
        return EngineStats(
            num_slots=self.scheduler.config.num_slots,
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_cells_used=self.scheduler.kv_cells_used,
            num_steps=self.num_steps,
            num_prefill_tokens=self.num_prefill_tokens,
            num_generated_tokens=self.num_generated_tokens,
            num_preemptions=self.scheduler.num_preemptions,
            num_decode_failures=self.num_decode_failures,
            last_batch_size=self.last_batch_size,
            batch_size_bounds=BATCH_SIZE_BOUNDS,
            batch_size_counts=tuple(self.batch_size_counts),
            batch_size_sum=self.batch_size_sum,
        )
