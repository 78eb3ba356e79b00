"""The engine thread: owns the llama context and runs the step loop.

    while running:
        take commands (submit, abort, embed, stop)
        chunks = scheduler.schedule()      # policy
        sampled = runner.run(chunks)       # one llama_decode
        actions = postprocess(chunks, sampled)  # pure: outputs, ends, saves
        run(actions)                            # KV, cache, outbox

Outputs of one step leave in one `deliver` call, so the event loop is woken once per
step rather than once per token.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import time
from collections.abc import Callable, Mapping
from collections.abc import Sequence as Seq

from cache import CacheHit, PrefixCache
from engine.commands import (
    Abort,
    Command,
    Embed,
    Fork,
    Hold,
    OpenLane,
    ReleaseSession,
    Stop,
    Submit,
)
from engine.llama import Context, Model
from engine.sequence import SeqStatus, Sequence
from engine.thread import lanes, recovery
from engine.thread.embedder import Embedder
from engine.thread.kvexec import KvExecutor
from engine.thread.placement import find_usable
from engine.thread.postprocess import Emit, End, Force, StepRules, postprocess
from engine.thread.relookup import look_again
from engine.thread.runner import DecodeError, Runner, StepResult
from engine.thread.scheduler import Chunk, Scheduler
from engine.thread.slots import slot_views
from engine.thread.stats import snapshot
from engine.types import EngineStats, FinishReason, SeqOutput, TimeLimits, TokenLogprob, coded_error

log = logging.getLogger("kvserve.engine")

Deliver = Callable[[list[tuple[object, SeqOutput]]], None]


class Worker:
    def __init__(
        self,
        model: Model,
        ctx: Context,
        scheduler: Scheduler,
        embedder: Embedder | None,
        deliver: Deliver,
        cache: PrefixCache | None = None,
        limits: TimeLimits | None = None,
    ):
        self.model = model
        self.limits = limits or TimeLimits()
        # Written by this thread, read by the watchdog thread (engine/thread/watchdog.py).
        self.decode_deadline = 0.0
        self.ctx = ctx
        self.scheduler = scheduler
        config = scheduler.config
        self.runner = Runner(
            ctx, config.step_tokens, solo_rows=config.solo_rows, vision=model.vision
        )
        self.embedder = embedder
        self.deliver = deliver
        self.cache = cache
        self.commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._outbox: list[tuple[object, SeqOutput]] = []
        self._stopping = False
        self._rules = StepRules(model.eog_ids, config.n_ctx_seq, saves=cache is not None,
                                blob_bound=config.saves_checkpoints)  # fmt: skip
        # For stats(): the scheduler's, so one object counts everything and outlives
        # this worker (engine/thread/stats.py). Written by this thread only.
        self.counters = scheduler.counters
        self.ops = KvExecutor(ctx, scheduler.slots, cache, self.counters, config.num_slots,
                              config.window_recut)  # fmt: skip
        self.kv = self.ops.kv  # the KV ledger
        self.last_batch_size = 0  # a gauge: not carried over

    @property
    def check_kv(self) -> bool:
        """Tests: check the ledger against the scheduler every loop, and fail a save
        under tokens the slot does not hold."""
        return self.ops.check_kv

    @check_kv.setter
    def check_kv(self, on: bool) -> None:
        self.ops.check_kv = on

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
                    self._enforce_limits()
                    self.step()
                if self.check_kv:
                    self.check_integrity()
            except Exception as exc:  # a bug must cost its requests, never the engine thread
                log.exception("engine step failed")
                # If this raises too, the thread ends: the engine rebuilds it (engine.py).
                self._fail_everything(f"internal engine error: {type(exc).__name__}: {exc}")
            if self._outbox:
                out, self._outbox = self._outbox, []
                self.deliver(out)
        self._abort_all()
        self.ops.save_residents()

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
        elif isinstance(command, Hold):
            for request_id in command.request_ids:
                found = self.scheduler.find(request_id)
                if found is not None:
                    found.holding = True
        elif isinstance(command, OpenLane):
            if (found := self.scheduler.find(command.request_id)) is not None:
                found.lane = command.lane
        elif isinstance(command, Embed):
            if self.embedder is None:
                command.job.on_done(None, "embeddings are disabled")
            else:
                self.embedder.jobs.append(command.job)
        elif isinstance(command, ReleaseSession):
            self.ops.release(command.session_id)
        elif isinstance(command, Fork):
            self.ops.fork(command)
        elif isinstance(command, Stop):
            self._stopping = True

    def _enforce_limits(self) -> None:
        """End every sequence past one of its time limits (its slot is freed)."""
        seqs = list(self.scheduler.running) + list(self.scheduler.waiting)
        for seq, error in recovery.overdue(seqs, self.limits, time.monotonic()):
            self.counters.num_timeouts += 1
            self._finish(seq, FinishReason.ERROR, "", error=error)

    def abandon(self, cause: str) -> None:
        """The thread died (engine.py rebuilds it): every request in flight or queued
        fails at once naming `cause`, touching no llama.cpp state (engine/thread/recovery.py)."""
        seqs = list(self.scheduler.running) + list(self.scheduler.waiting)
        outputs, stop = recovery.abandon(seqs, self.commands, self.embedder, cause)
        self._stopping = self._stopping or stop
        out, self._outbox = self._outbox + outputs, []
        self.deliver(out)

    # -- one step ----------------------------------------------------------------------

    def step(self) -> None:
        scheduler = self.scheduler
        if (
            self.cache is not None
            and scheduler.waiting
            and len(scheduler.running) < scheduler.config.num_slots
        ):
            look_again(scheduler.waiting, self.cache, scheduler.config)  # (relookup.py)
        chunks, kv = scheduler.schedule()
        planned = time.monotonic()
        for chunk in chunks:  # stage times for traces
            if chunk.seq.t_admitted is None:
                chunk.seq.t_admitted = planned
        failed = self.ops.run(kv.ops)
        if failed:  # planned from a prefix that is not there: re-planned next step
            chunks = [c for c in chunks if c.seq not in failed]
        for chunk in chunks:
            if not chunk.seq.announced:
                self._announce(chunk.seq)
        if not chunks:
            time.sleep(0.001)  # nothing runnable (cannot happen while invariants hold)
            return
        started = time.monotonic()
        if self.limits.decode_s:
            self.decode_deadline = started + self.limits.decode_s
        self.ctx.set_loras(chunks[0].seq.lora)  # one adapter set a step (see the scheduler)
        try:
            result = self.runner.run(chunks)
        except DecodeError as exc:
            self._decode_failed(chunks, exc)
            return
        finally:
            self.decode_deadline = 0.0
        if result.failed:
            chunks = self._media_failed(chunks, result.failed)
        for chunk in chunks:  # stage times for the metrics
            if chunk.seq.t_scheduled is None:
                chunk.seq.t_scheduled = started
        self._postprocess(chunks, result)

    def check_integrity(self) -> None:
        """The scheduler's invariants, and its view of every slot's KV against the
        ledger's (and llama.cpp's). Raises AssertionError."""
        self.scheduler.check_integrity()
        self.kv.check(self.scheduler)

    def _postprocess(self, chunks: list[Chunk], result: StepResult) -> None:
        """Run what the step means (engine/thread/postprocess.py decides), in its order."""
        self.kv.decoded(chunks)
        outcome = postprocess(chunks, result, self._rules, self.counters)
        self.last_batch_size = outcome.num_tokens
        for action in outcome.actions:
            if isinstance(action, Emit):
                self._emit(action.seq, action.output)
            elif isinstance(action, End):
                self._finish(action.seq, action.reason, action.text, action.token_ids,
                             action.logprobs)  # fmt: skip
            elif isinstance(action, Force):
                if action.seq.sampler is not None:
                    action.seq.sampler.force(action.tokens)
            else:
                self.ops.run([action])

    def _announce(self, seq: Sequence) -> None:
        """A sequence's first chunk is placed: how much of its prompt was found is known
        now, before its prefill (Anthropic's message_start reports it; a long cold
        prompt's client sees it minutes before the first token)."""
        seq.announced = True
        self._emit(seq, SeqOutput("", (), num_prompt_tokens=seq.num_prompt_tokens,
                                  num_cached_tokens=seq.num_cached))  # fmt: skip

    def _emit(self, seq: Sequence, output: SeqOutput) -> None:
        if seq.prompt_logprobs:  # sent once, with the first output after the prompt
            output = dataclasses.replace(output, prompt_logprobs=tuple(seq.prompt_logprobs))
            seq.prompt_logprobs.clear()
        for handed in lanes.handed(seq, output, time.monotonic(), self.counters):
            self._outbox.append((seq.sink, handed))

    def _finish(
        self,
        seq: Sequence,
        reason: FinishReason,
        text: str,
        token_ids: tuple[int, ...] = (),
        logprobs: tuple[TokenLogprob, ...] = (),
        error: str | None = None,
    ) -> None:
        # A failed sequence's cells may be half-written: never offer them for reuse.
        keep = reason is not FinishReason.ERROR
        saved, num_kv = False, 0
        if keep and seq.slot is not None and seq.status is SeqStatus.RUNNING:
            kept = self.scheduler.reusable(seq)
            num_kv = len(kept)
            # What may not be reused goes first (if llama.cpp cannot cut it, all goes).
            keep = self.kv.remove_seq(seq.slot, num_kv)
            saved = keep and self.ops.save(seq.slot, kept, seq.salt)
            num_kv = num_kv if keep else 0
        counts = self.counters
        counts.hits[seq.hit_kind] = counts.hits.get(seq.hit_kind, 0) + 1
        counts.hit_sources[seq.hit_source] = counts.hit_sources.get(seq.hit_source, 0) + 1
        if seq.hit_kind == "cold" and seq.cold_reason:
            counts.cold_reasons[seq.cold_reason] = counts.cold_reasons.get(seq.cold_reason, 0) + 1
        counts.num_reused_tokens += seq.num_cached
        drop = self.scheduler.remove(seq, keep_kv=keep, saved=saved)
        if drop is not None:
            self.kv.remove_seq(drop.slot, drop.start)
        if seq.sampler is not None:
            seq.sampler.close()
        seq.t_finished = time.monotonic()
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
                num_reasoning_tokens=seq.thinking.num_tokens if seq.thinking else 0,
                hit_kind=seq.hit_kind,
                stop_sequence=seq.detokenizer.matched,
                num_kv_tokens=num_kv,
                timings=seq.timings(),
            ),
        )

    def _decode_failed(self, chunks: list[Chunk], exc: DecodeError) -> None:
        # The failed batch may have left cells behind: drop what it added.
        for chunk in chunks:
            slot = chunk.seq.slot
            if slot is not None and not self.kv.remove_seq(slot, chunk.start):
                KvExecutor.start_cold(chunk.seq)  # its slot was emptied instead
        if exc.code == 1 and len(self.scheduler.running) > 1:
            # Out of KV cells (fragmentation): make room and retry next step.
            self.kv.remove_seq(self.scheduler.preempt_newest())
            log.warning("KV cache full; preempted the newest sequence")
            return
        error = str(exc)
        if exc.code == 2:  # interrupted by the watchdog: the context stays usable
            self.counters.num_decode_aborts += 1
            error = coded_error(
                "decode_timeout", f"a model step ran past {self.limits.decode_s:g} s"
            )
        else:
            self.counters.num_decode_failures += 1
        log.error("%s; failing %d sequence(s)", error, len(chunks))
        for seq in {id(c.seq): c.seq for c in chunks}.values():
            self._finish(seq, FinishReason.ERROR, "", error=error)

    def _media_failed(self, chunks: list[Chunk], failed: list[tuple[Chunk, str]]) -> list[Chunk]:
        """The step's chunks less those whose image could not be encoded: each of those
        fails its own request, its cells from the chunk on dropped (the text runs before
        the image were decoded)."""
        for chunk, error in failed:
            slot = chunk.seq.slot
            if slot is not None and not self.kv.remove_seq(slot, chunk.start):
                KvExecutor.start_cold(chunk.seq)  # its slot was emptied instead
            self._finish(chunk.seq, FinishReason.ERROR, "", error=error)
        return [c for c in chunks if all(c is not f for f, _ in failed)]

    def _fail_everything(self, error: str) -> None:
        for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
            try:
                self._finish(seq, FinishReason.ERROR, "", error=error)
            except Exception:  # the bookkeeping itself is broken: still tell the caller
                log.exception("failing %s cleanly failed", seq.request_id)
                self._outbox.append(recovery.failed(seq, error))
        if self.embedder is not None:
            while self.embedder.jobs:
                job = self.embedder.jobs.popleft()
                job.on_done(None, error)
            self.embedder.ctx.clear()
        self.kv.clear()
        self.scheduler.slots.forget_all()

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

    @property
    def pinned_sessions(self) -> Mapping[str, int]:
        """Session key -> the slot it pins, as this thread last published it: the one view
        of the pins another thread may read (SlotTable.published_pins)."""
        return self.scheduler.slots.published_pins

    def find_prefix(self, cache: PrefixCache, prompt: Seq[int], salt: str) -> CacheHit | None:
        """The longest stored prefix `prompt` can start from (placement.find_usable) under
        this worker's scheduler settings, which are fixed at load: any thread may ask."""
        return find_usable(cache, prompt, salt, self.scheduler.config)

    def stats(self) -> EngineStats:
        """Safe to call from another thread (see `engine.stats.snapshot`)."""
        scheduler = self.scheduler
        return snapshot(
            self.counters,
            num_slots=scheduler.config.num_slots,
            num_running=len(scheduler.running),
            num_waiting=len(scheduler.waiting),
            kv_cells_used=scheduler.kv_cells_used,
            num_sessions_pinned=len(scheduler.slots.published_pins),
            last_batch_size=self.last_batch_size,
            cache=self.cache.stats() if self.cache is not None else None,
            slots=slot_views(scheduler.slots, scheduler.running, scheduler.config.num_slots),
        )
