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

from cache import PrefixCache
from engine.embedder import Embedder, EmbedJob
from engine.kvledger import KvLedger, KvMismatch
from engine.llama import Context, Model
from engine.recovery import abandon_seq, enforce_limits
from engine.runner import DecodeError, Runner, Sampled, StepResult
from engine.scheduler import Chunk, Scheduler
from engine.sequence import SeqStatus, Sequence
from engine.slots import Copy, Drop, KvOp, Restore, Save
from engine.stats import BATCH_SIZE_BOUNDS
from engine.types import EngineStats, FinishReason, SeqOutput, TimeLimits, coded_error

log = logging.getLogger("kvserve.engine")

Deliver = Callable[[list[tuple[object, SeqOutput]]], None]



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
class ReleaseSession:
    """The session ended (deleted, expired or retired): its slot goes back to everyone."""

    session_id: str


@dataclass(frozen=True, slots=True)
class Fork:
    """Copy idle session `source`'s KV into a free slot pinned to new session `target`.
    `on_done(num_tokens, error)` is called on the engine thread."""

    source: str
    target: str
    on_done: Callable[[int, str | None], None]


@dataclass(frozen=True, slots=True)
class Stop:
    pass


Command = Submit | Abort | Embed | ReleaseSession | Fork | Stop

# A long cold prefill is saved to the cache along the way, so that another prompt
# sharing its head (or this one, after an abort or a restart) finds it warm.
SAVE_EVERY_TOKENS = 1024
SAVE_PROMPT_MIN_TOKENS = 256


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
        # Written by this thread, read by the watchdog thread (engine/watchdog.py).
        self.decode_deadline = 0.0
        self.ctx = ctx
        self.kv = KvLedger(ctx, scheduler.config.num_slots)  # every KV op goes through it
        self.check_kv = False  # tests: check the ledger against the scheduler every loop
        self.scheduler = scheduler
        config = scheduler.config
        solo = config.exact_min_rows if config.exact and config.keeps_prefixes else 0
        self.runner = Runner(ctx, config.step_tokens, solo_rows=solo)
        self.embedder = embedder
        self.deliver = deliver
        self.cache = cache
        self.commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._outbox: list[tuple[object, SeqOutput]] = []
        self._stopping = False
        self._eog = model.eog_ids
        self._n_ctx_seq = scheduler.config.n_ctx_seq
        # For stats(): the scheduler's, so one object counts everything and outlives
        # this worker (engine/stats.py). Written by this thread only.
        self.counters = scheduler.counters
        self.last_batch_size = 0  # a gauge: not carried over

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
                    enforce_limits(self)
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
        self._save_residents()

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
        elif isinstance(command, ReleaseSession):
            self._release(command.session_id)
        elif isinstance(command, Fork):
            self._fork(command)
        elif isinstance(command, Stop):
            self._stopping = True

    # -- one step ----------------------------------------------------------------------

    def step(self) -> None:
        chunks, kv = self.scheduler.schedule()
        planned = time.monotonic()
        for chunk in chunks:  # stage times for traces
            if chunk.seq.t_admitted is None:
                chunk.seq.t_admitted = planned
        failed = self._run_ops(kv.ops)
        if failed:  # planned from a prefix that is not there: re-planned next step
            chunks = [c for c in chunks if c.seq not in failed]
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
        for chunk in chunks:  # stage times for the metrics
            if chunk.seq.t_scheduled is None:
                chunk.seq.t_scheduled = started
        self._postprocess(chunks, result)

    def _run_ops(self, ops: list[KvOp]) -> list[Sequence]:
        """Run the plan's KV operations; return the sequences whose restore failed."""
        failed = []
        for op in ops:
            if isinstance(op, Save):
                self._save(op.slot, list(op.tokens), op.salt)
            elif isinstance(op, Restore) and not self._restore(op):
                failed.append(op.seq)
            elif isinstance(op, Copy):
                if not self.kv.copy_seq(op.src, op.dst) and op.seq is not None:
                    log.warning("copying a prefix failed; prefilling %s cold", op.seq.request_id)
                    self._start_cold(op.seq)
                    failed.append(op.seq)
            elif isinstance(op, Drop):
                self.kv.remove_seq(op.slot, op.start)
        return failed

    def _save(self, slot: int, tokens: list[int], salt: str, *, wait: bool = False) -> bool:
        """Hand the slot's KV for `tokens` to the cache; True if it was taken.

        The state is copied out here, on the engine thread (a few ms for thousands of
        tokens); the cache's writer thread does the rest. `wait`: for room in its queue
        (a drain), where a step's save is dropped rather than stall decoding."""
        cache = self.cache
        if cache is None or len(tokens) < cache.config.min_tokens:
            return False
        if not self.kv.holds(slot, tokens):  # never store KV under other tokens
            self.kv.num_refused_saves += 1
            log.error("refused to save slot %d: its KV is not of the tokens given", slot)
            if self.check_kv:
                raise KvMismatch(f"save of slot {slot} under tokens it does not hold")
            return False
        return cache.save(tokens, self.ctx.get_seq_state(slot), salt, wait=wait)

    def _restore(self, op: Restore) -> bool:
        seq, slot = op.seq, op.slot
        started = time.monotonic()
        ok = self.kv.restore(slot, op.hit.state, op.hit.tokens)
        # The state must hold at least the positions we keep (a foreign or damaged
        # blob that llama.cpp accepted would show here), and of this prompt's tokens.
        if ok and self.ctx.seq_pos_max(slot) >= op.keep - 1:
            self.kv.remove_seq(slot, op.keep)
            if self.kv.holds(slot, seq.tokens[: op.keep]):
                seq.t_restore = (started, time.monotonic())
                return True
        log.warning("restoring a cached prefix failed; prefilling %s cold", seq.request_id)
        self.counters.num_restore_failures += 1
        self.kv.remove_seq(slot)
        self._start_cold(seq)
        return False

    @staticmethod
    def _start_cold(seq: Sequence) -> None:
        """The prefix planned for `seq` is not there: it prefills from the start."""
        seq.num_computed = seq.num_cached = seq.num_saved = 0
        seq.hit_kind, seq.hit_source = "cold", "none"

    def _save_long_prefill(self, seq: Sequence) -> None:
        if self.cache is None or seq.status is not SeqStatus.RUNNING or seq.slot is None:
            return
        done = min(seq.num_computed, seq.num_prompt_tokens)
        fresh = done - seq.num_saved
        prompt_done = done == seq.num_prompt_tokens
        if fresh >= SAVE_EVERY_TOKENS or (prompt_done and fresh >= SAVE_PROMPT_MIN_TOKENS):
            self._save(seq.slot, seq.tokens[:done], seq.salt)
            seq.num_saved = done

    def _release(self, session: str) -> None:
        """The session's slot goes back to everyone, what it holds to the cache first
        (unless its finish already saved it: a busy writer drops saves), so whoever
        resumes the conversation later starts warm."""
        slots = self.scheduler.slots
        slot = slots.unpin(session)
        resident = slots.resident.get(slot) if slot is not None else None
        if slot is not None and resident is not None and not resident.saved:
            resident.saved = self._save(slot, resident.tokens, resident.salt)

    def _fork(self, command: Fork) -> None:
        ops: list[KvOp] = []
        try:
            num_tokens = self.scheduler.slots.fork(command.source, command.target, ops)
        except LookupError:
            num_tokens = 0  # the source holds no slot: the copy starts from the cache
        except RuntimeError:
            command.on_done(0, "every slot is busy")
            return
        self._run_ops(ops)
        slots = self.scheduler.slots
        slot = slots.pins.get(command.target)
        resident = slots.resident.get(slot) if slot is not None else None
        if slot is not None and resident is not None and not self.kv.holds(slot, resident.tokens):
            slots.resident.pop(slot)  # the copy failed: the slot holds nothing
            slots.unpin(command.target)
            command.on_done(0, "copying the session's KV failed")
            return
        command.on_done(num_tokens, None)

    def check_integrity(self) -> None:
        """The scheduler's invariants, and its view of every slot's KV against the
        ledger's (and llama.cpp's). Raises AssertionError."""
        self.scheduler.check_integrity()
        self.kv.check(self.scheduler)

    def _save_residents(self) -> None:
        """Shutdown or unload: what the slots hold goes to the cache (finished requests
        already did; this catches saves that were dropped). Each save waits for room in
        the writer's queue: the README promises these. What the cache would not take
        (too short, too big, a stuck writer) is logged; the cache counts its drops."""
        if self.cache is None:
            return
        unsaved = 0
        for slot, resident in self.scheduler.slots.resident.items():
            if not resident.saved:
                resident.saved = self._save(slot, resident.tokens, resident.salt, wait=True)
                wanted = len(resident.tokens) >= self.cache.config.min_tokens
                unsaved += wanted and not resident.saved
        if unsaved:
            log.warning("%d slot(s) not saved to the cache at the drain", unsaved)

    def _postprocess(self, chunks: list[Chunk], result: StepResult) -> None:
        self.kv.decoded(chunks)
        num_tokens = num_decode_rows = 0
        for chunk in chunks:
            num_tokens += chunk.length
            num_decode_rows += chunk.length if chunk.seq.is_decoding else 0
            # Draft rows count once accepted, token by token (below).
            chunk.seq.num_computed += chunk.length - len(chunk.draft)
            if chunk.seq.t_prompt_done is None and not chunk.seq.num_pending_prompt:
                chunk.seq.t_prompt_done = time.monotonic()
        self.counters.num_steps += 1
        self.last_batch_size = num_tokens
        self.counters.batch_size_counts[bisect.bisect_left(BATCH_SIZE_BOUNDS, num_tokens)] += 1
        self.counters.batch_size_sum += num_tokens
        self.counters.num_prefill_tokens += num_tokens - num_decode_rows
        for seq, logprobs in result.scored:
            seq.prompt_logprobs.extend(logprobs)
            seq.num_scored += len(logprobs)
        for seq, drafted, accepted in result.drafts:
            assert seq.drafter is not None and seq.slot is not None
            if accepted < drafted:  # the rejected guesses' KV (num_computed: the pending token's)
                self.kv.remove_seq(seq.slot, seq.num_computed + accepted)
            seq.drafter.feedback(drafted, accepted)
            self.counters.num_drafted_tokens += drafted
            self.counters.num_accepted_tokens += accepted
        for item in result.sampled:
            if item.after_draft:
                if item.seq.status is not SeqStatus.RUNNING:
                    continue  # it ended on an earlier token of this step (stop, EOG, length)
                item.seq.num_computed += 1
            self._append(item)
        for chunk in chunks:
            seq = chunk.seq
            if seq.num_pending == 0 and seq.status is SeqStatus.RUNNING:
                self._finish(seq, FinishReason.LENGTH, "")  # max_tokens 0: prompt scored
            elif not chunk.sample or seq.num_output_tokens == 1:
                self._save_long_prefill(seq)

    def _append(self, item: Sampled) -> None:
        seq, token = item.seq, item.token
        if token is None:  # the grammar is complete (or admits nothing): it ends here
            self._finish(seq, FinishReason.STOP, seq.detokenizer.flush())
            return
        seq.tokens.append(token)
        self.counters.num_generated_tokens += 1
        seq.t_last_token = time.monotonic()
        if seq.t_first_token is None:
            seq.t_first_token = seq.t_last_token
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
        keep = reason is not FinishReason.ERROR
        saved, num_kv = False, 0
        if keep and seq.slot is not None and seq.status is SeqStatus.RUNNING:
            kept = self.scheduler.reusable(seq)
            num_kv = len(kept)
            self.kv.remove_seq(seq.slot, num_kv)  # what may not be reused goes first
            saved = self._save(seq.slot, kept, seq.salt)
        counts = self.counters
        counts.hits[seq.hit_kind] = counts.hits.get(seq.hit_kind, 0) + 1
        counts.hit_sources[seq.hit_source] = counts.hit_sources.get(seq.hit_source, 0) + 1
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
                hit_kind=seq.hit_kind,
                stop_sequence=seq.detokenizer.matched,
                num_kv_tokens=num_kv,
                timings=seq.timings(),
            ),
        )

    def _decode_failed(self, chunks: list[Chunk], exc: DecodeError) -> None:
        # The failed batch may have left cells behind: drop what it added.
        for chunk in chunks:
            if chunk.seq.slot is not None:
                self.kv.remove_seq(chunk.seq.slot, chunk.start)
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

    def _fail_everything(self, error: str) -> None:
        for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
            try:
                self._finish(seq, FinishReason.ERROR, "", error=error)
            except Exception:  # the bookkeeping itself is broken: still tell the caller
                log.exception("failing %s cleanly failed", seq.request_id)
                abandon_seq(self, seq, error)
        if self.embedder is not None:
            while self.embedder.jobs:
                job = self.embedder.jobs.popleft()
                job.on_done(None, error)
            self.embedder.ctx.clear()
        self.kv.clear()
        self.scheduler.slots.resident.clear()

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
        """Safe to call from another thread: reads plain ints, list lengths and copies
        of the dicts (a copy is one C call under the GIL; iterating a dict the engine
        thread grows could fail mid-way)."""
        c = self.counters
        hits, sources = c.hits.copy(), c.hit_sources.copy()
        return EngineStats(
            num_slots=self.scheduler.config.num_slots,
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_cells_used=self.scheduler.kv_cells_used,
            num_steps=c.num_steps,
            num_prefill_tokens=c.num_prefill_tokens,
            num_generated_tokens=c.num_generated_tokens,
            num_preemptions=c.num_preemptions,
            num_decode_failures=c.num_decode_failures,
            last_batch_size=self.last_batch_size,
            num_sessions_pinned=len(self.scheduler.slots.pins),
            num_reclaims=c.num_reclaims,
            num_restore_failures=c.num_restore_failures,
            num_reused_tokens=c.num_reused_tokens,
            num_drafted_tokens=c.num_drafted_tokens,
            num_accepted_tokens=c.num_accepted_tokens,
            hits=tuple(sorted(hits.items())),
            hit_sources=tuple(sorted(sources.items())),
            cache=self.cache.stats() if self.cache is not None else None,
            batch_size_bounds=BATCH_SIZE_BOUNDS,
            batch_size_counts=tuple(c.batch_size_counts),
            batch_size_sum=c.batch_size_sum,
            num_decode_aborts=c.num_decode_aborts,
            num_timeouts=c.num_timeouts,
            num_rebuilds=c.num_rebuilds,
        )
