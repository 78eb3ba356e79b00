"""Running the KV operations the scheduler planned (engine/thread/slots.py) on the context:
saves to the prefix cache, restores from it, copies between slots, dropped cells; and
the session commands that move KV (release, fork), and the drain's saves.

Every operation goes through the KV ledger (engine/thread/kvledger.py), and a save is refused
when the slot does not hold the tokens it would be stored under. Engine thread only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from cache import PrefixCache
from engine.commands import Fork
from engine.llama import Context
from engine.sequence import Sequence
from engine.thread.kvledger import KvLedger, KvMismatch
from engine.thread.placement import KV_OP_FAILED
from engine.thread.slots import Copy, Drop, KvOp, Restore, Save, SlotTable
from engine.thread.stats import StepCounters

log = logging.getLogger("kvserve.engine")


class KvExecutor:
    def __init__(
        self,
        ctx: Context,
        slots: SlotTable,
        cache: PrefixCache | None,
        counters: StepCounters,
        num_slots: int,
        recut: int = 0,
    ):
        self.ctx = ctx
        # Every KV op goes through the ledger; under exact reuse a window's blob is laid
        # out as a cold sequence's cells (engine/thread/window_blob.py), and saved with
        # `recut` (SchedulerConfig.window_recut) window cells more (window_keep.py).
        self.kv = KvLedger(ctx, num_slots, counters, slots.n_swa, slots.exact and slots.n_swa > 0,
                           recut)  # fmt: skip
        self.slots = slots
        self.cache = cache
        self.counters = counters
        self.check_kv = False  # tests: a save under tokens not held raises

    def run(self, ops: Iterable[KvOp]) -> list[Sequence]:
        """Run the plan's KV operations; return the sequences whose restore failed."""
        failed = []
        for op in ops:
            if isinstance(op, Save):
                self.save(op.slot, list(op.tokens), op.salt)
            elif isinstance(op, Restore) and not self.restore(op):
                failed.append(op.seq)
            elif isinstance(op, Copy):
                if not self.kv.copy_seq(op.src, op.dst) and op.seq is not None:
                    log.warning("copying a prefix failed; prefilling %s cold", op.seq.request_id)
                    self.start_cold(op.seq)
                    failed.append(op.seq)
            elif isinstance(op, Drop) and not (
                self.kv.cut(op.slot, op.start) if op.seq is not None
                else self.kv.remove_seq(op.slot, op.start)
            ):  # fmt: skip
                self.slots.forget(op.slot)  # (a free slot's resident prefix went with it)
                if op.seq is not None and op.seq not in failed:
                    self.start_cold(op.seq)
                    failed.append(op.seq)
        return failed

    def save(self, slot: int, tokens: list[int], salt: str, *, wait: bool = False) -> bool:
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
        return cache.save(tokens, self.kv.saved_state(slot), salt, wait=wait)

    def restore(self, op: Restore) -> bool:
        seq, slot = op.seq, op.slot
        started = time.monotonic()
        ok = self.kv.restore(slot, op.hit.state, op.hit.tokens)
        # The state must hold at least the positions we keep (a foreign or damaged
        # blob that llama.cpp accepted would show here), and of this prompt's tokens.
        held = ok and self.ctx.seq_pos_max(slot) >= op.keep - 1 and self.kv.cut(slot, op.keep)
        if held and self.kv.holds(slot, seq.tokens[: op.keep]):
            seq.t_restore = (started, time.monotonic())  # for traces
            return True
        log.warning("restoring a cached prefix failed; prefilling %s cold", seq.request_id)
        self.counters.num_restore_failures += 1
        self.kv.remove_seq(slot)
        self.start_cold(seq)
        return False

    @staticmethod
    def start_cold(seq: Sequence) -> None:
        """The prefix planned for `seq` is not there (a restore, copy or cut failed): it
        prefills from the start."""
        seq.num_computed = seq.num_cached = seq.num_saved = seq.kv_floor = 0
        seq.hit_kind, seq.hit_source, seq.cold_reason = "cold", "none", KV_OP_FAILED

    def release(self, session: str) -> None:
        """The session's slot goes back to everyone, what it holds to the cache first
        (unless its finish already saved it: a busy writer drops saves), so whoever
        resumes the conversation later starts warm."""
        slots = self.slots
        slot = slots.unpin(session)
        resident = slots.resident.get(slot) if slot is not None else None
        if slot is not None and resident is not None and not resident.saved:
            resident.saved = self.save(slot, resident.tokens, resident.salt)

    def fork(self, command: Fork) -> None:
        ops: list[KvOp] = []
        try:
            num_tokens = self.slots.fork(command.source, command.target, ops)
        except LookupError:
            num_tokens = 0  # the source holds no slot: the copy starts from the cache
        except RuntimeError:
            command.on_done(0, "every slot is busy")
            return
        self.run(ops)
        slots = self.slots
        slot = slots.pins.get(command.target)
        resident = slots.resident.get(slot) if slot is not None else None
        if slot is not None and resident is not None and not self.kv.holds(slot, resident.tokens):
            slots.forget(slot)  # the copy failed: the slot holds nothing
            slots.unpin(command.target)
            command.on_done(0, "copying the session's KV failed")
            return
        command.on_done(num_tokens, None)

    def save_residents(self) -> None:
        """Shutdown or unload: what the slots hold goes to the cache (finished requests
        already did; this catches saves that were dropped). Each save waits for room in
        the writer's queue: the README promises these. What the cache would not take
        (too short, too big, a stuck writer) is logged; the cache counts its drops."""
        if self.cache is None:
            return
        unsaved = 0
        for slot, resident in self.slots.resident.items():
            if not resident.saved:
                resident.saved = self.save(slot, resident.tokens, resident.salt, wait=True)
                wanted = len(resident.tokens) >= self.cache.config.min_tokens
                unsaved += wanted and not resident.saved
        if unsaved:
            log.warning("%d slot(s) not saved to the cache at the drain", unsaved)
