"""The KV ledger: which token ids each slot's KV cells were computed from.

Every KV operation the worker runs goes through here, so the ledger is a shadow of
llama.cpp's memory built from what was really done to it (drops, copies, restores,
decodes), independent of the scheduler's view. `check` compares the two: a running
sequence's slot must hold exactly its computed tokens, a free slot exactly its resident
prefix (or nothing). A save is refused when the slot does not hold the tokens it is to
be stored under, so a bookkeeping slip can cost a cache entry, never poison one.

Every operation here takes effect at once (see `Context.copy_seq`): nothing is queued
for a later decode, so no restore, save or reclaim can overtake a pending copy.
Engine thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from engine.llama import Context
from engine.thread.stats import StepCounters
from engine.thread.window_blob import at_cold_cells
from engine.thread.window_keep import Window, merge, split

if TYPE_CHECKING:
    from engine.thread.scheduler import Chunk, Scheduler

log = logging.getLogger("kvserve.engine")


class KvMismatch(AssertionError):
    """The scheduler believes a slot holds KV it does not hold."""


class KvLedger:
    def __init__(
        self,
        ctx: Context,
        num_slots: int,
        counters: StepCounters | None = None,
        n_swa: int = 0,
        cold_cells: bool = False,
        recut: int = 0,
    ):
        self.ctx = ctx
        self.counters = counters if counters is not None else StepCounters()
        self.n_swa = n_swa  # the model's sliding window; 0: none
        # A window's blob goes in laid out as a cold sequence's cells (exact reuse).
        self.cold_cells = cold_cells
        # SchedulerConfig.window_recut: saved states carry this many window cells more
        # (window_keep.merge), from the window an earlier blob of the slot held and the
        # positions below which the slot still holds those cells as they were.
        self.recut = recut
        self.windows: dict[int, tuple[Window, int]] = {}
        # Under cold_cells, where a slot's real window cells start (below: the zero cells
        # window_blob put there, which llama.cpp counts as held): a cut must keep them out
        # of the next token's window (`cut`).
        self.window_first: dict[int, int] = {}
        self.slots: list[list[int]] = [[] for _ in range(num_slots)]
        self.num_refused_saves = 0

    # -- the KV operations ---------------------------------------------------------------

    def remove_seq(self, slot: int, start: int = 0) -> bool:
        """Keep the slot's first `start` positions. False when llama.cpp refused to cut
        there (a recurrent or hybrid memory holds one state per sequence, not a cell per
        position): then the whole slot is dropped, so it never holds a longer state than
        the ledger says, and the caller's sequence must start cold. Counted, and logged
        the first time (the scheduler plans such cuts only by mistake:
        engine/thread/placement.py)."""
        if self.ctx.remove_seq(slot, start):
            del self.slots[slot][start:]
            self._cut_windows(slot, start)
            return True
        self.ctx.remove_seq(slot)
        self.slots[slot].clear()
        self._cut_windows(slot, 0)
        self.counters.num_refused_drops += 1
        if self.counters.num_refused_drops == 1:
            log.warning(
                "llama.cpp refused to cut a sequence back to %d tokens (this model's memory "
                "cannot drop a tail): it is computed again from the start (counted in "
                "kvserve_kv_refused_drops_total; logged once)",
                start,
            )
        return False

    def cut(self, slot: int, keep: int) -> bool:
        """Cut the slot back to `keep` positions for a sequence to continue from: False
        (the whole slot dropped, counted) when llama.cpp refuses, or when the cells the next
        position attends to are not all there (a sliding-window state that came through a
        blob holds only its last n_swa positions' window cells: slots.window_floor)."""
        whole = keep >= len(self.slots[slot])  # nothing to cut: it goes on from its end,
        if not self.remove_seq(slot, keep):  # where llama.cpp keeps what the next needs
            return False
        if whole:  # (a recurrent memory's smallest position is its last: no window check)
            return True
        window_start = max(0, keep - self.n_swa + 1)  # the first position keep attends to
        held_from = max(self.ctx.seq_pos_min(slot), self.window_first.get(slot, 0))
        if self.n_swa <= 0 or keep == 0 or held_from <= window_start:
            return True
        self.remove_seq(slot)
        self.counters.num_refused_drops += 1
        log.error("slot %d cut to %d lacks its window's cells; computed again", slot, keep)
        return False

    def copy_seq(self, src: int, dst: int) -> bool:
        self._cut_windows(dst, 0)
        if self.cold_cells and self.slots[src]:
            ok = self._set_state(dst, self.ctx.get_seq_state(src))
        else:
            ok = self.ctx.copy_seq(src, dst)
        self.slots[dst] = list(self.slots[src]) if ok else []
        if not ok:
            self.ctx.remove_seq(dst)
        return ok

    def restore(self, slot: int, state: bytes, tokens: Sequence[int]) -> bool:
        """Load a cached state stored for `tokens` into the empty `slot`."""
        ok = self._set_state(slot, state)
        self.slots[slot] = list(tokens) if ok else []
        return ok

    def saved_state(self, slot: int) -> bytes:
        """The slot's state for the prefix cache: under `recut`, with the window cells
        of the slot's last blob that join its window in front of it (window_keep)."""
        state = self.ctx.get_seq_state(slot)
        if not self.recut:
            return state
        kept = self.windows.get(slot)
        state, window = merge(state, kept[0] if kept else None, kept[1] if kept else 0,
                              self.recut)  # fmt: skip
        if window is None:
            self.windows.pop(slot, None)
        else:
            held = len(self.slots[slot])
            self.windows[slot] = (window.kept(held, self.n_swa, self.recut), held)
        return state

    def _cut_windows(self, slot: int, start: int) -> None:
        """The slot's cells from `start` on are gone (all of them: start 0)."""
        if start == 0:
            self.windows.pop(slot, None)
            self.window_first.pop(slot, None)
        elif slot in self.windows:
            window, valid = self.windows[slot]
            self.windows[slot] = (window, min(valid, start))

    def _set_state(self, slot: int, state: bytes) -> bool:
        """False where llama.cpp refuses the blob, or a window's blob is of a layout
        window_blob does not know (a restore that would not be exact: none)."""
        if self.cold_cells:
            padded, parts = at_cold_cells(state), split(state)
            if padded is None or parts is None:
                log.warning("a sliding-window state of an unknown layout was not restored")
                return False
            self._cut_windows(slot, 0)
            if not self.ctx.set_seq_state(slot, padded):
                return False
            window = parts[1]
            self.window_first[slot] = window.first
            if self.recut:  # its window cells, for the next save's merge
                held = window.first + window.count
                self.windows[slot] = (window.kept(held, self.n_swa, self.recut), held)
            return True
        return self.ctx.set_seq_state(slot, state)

    def decoded(self, chunks: list[Chunk]) -> None:
        """A decode computed these chunks' tokens into their slots."""
        for chunk in chunks:
            slot = chunk.seq.slot
            assert slot is not None
            # llama.cpp only decodes positions that follow the slot's last one, so a
            # chunk starts where the slot's KV ends (if the ledger is right; `check`).
            # A speculative chunk's guesses are not in the sequence's tokens (yet): the
            # worker drops the rejected ones through `remove_seq`.
            if chunk.draft:
                self.slots[slot].extend((chunk.seq.tokens[chunk.start], *chunk.draft))
            else:
                self.slots[slot].extend(chunk.seq.tokens[chunk.start : chunk.start + chunk.length])

    def clear(self) -> None:
        self.ctx.clear()
        for held in self.slots:
            held.clear()
        self.windows.clear()
        self.window_first.clear()

    # -- questions -------------------------------------------------------------------------

    def holds(self, slot: int, tokens: Sequence[int]) -> bool:
        """True if the slot's first len(tokens) cells were computed from `tokens`."""
        held = self.slots[slot]
        return len(held) >= len(tokens) and held[: len(tokens)] == list(tokens)

    def check(self, scheduler: Scheduler) -> None:
        """Raise KvMismatch where the scheduler's view differs from the ledger's, or the
        ledger's from llama.cpp's (the last position each slot holds)."""
        expected: dict[int, list[int]] = {}
        for seq in scheduler.running:
            assert seq.slot is not None
            expected[seq.slot] = seq.tokens[: seq.num_computed]
        for slot, resident in scheduler.slots.resident.items():
            expected[slot] = resident.tokens
        for slot, held in enumerate(self.slots):
            want = expected.get(slot, [])
            if held != want:
                raise KvMismatch(
                    f"slot {slot} holds KV of {len(held)} tokens, the scheduler believes"
                    f" {len(want)} (first difference at {_first_difference(held, want)})"
                )
            if self.ctx.seq_pos_max(slot) != len(held) - 1:
                raise KvMismatch(
                    f"slot {slot}: llama.cpp holds positions up to "
                    f"{self.ctx.seq_pos_max(slot)}, the ledger {len(held) - 1}"
                )


def _first_difference(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))
