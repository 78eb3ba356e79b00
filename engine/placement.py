"""Placement: which slot a newly admitted sequence gets, and the longest prefix of its
prompt it can start from, in this order of cost: its own slot's resident tokens (a free
slot, or its session's pinned slot), a copy of another slot's KV stream (busy or free),
or a state restored from the prefix cache. Prefixes are only shared between requests
with the same cache salt.

Pure policy, no llama.cpp: it writes the slot table through its methods and appends the
KV operations the worker must run (engine/slots.py). Engine thread only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.media import whole_image_keep
from engine.plan import FLASH_TILE_ROWS, SchedulerConfig, common_prefix
from engine.sequence import Sequence
from engine.slots import Copy, Drop, KvOp, Restore, SlotTable, window_floor

# Copying a slot's KV stream moves the whole stream (all n_ctx_seq cells of every layer,
# ~94 MB for the default model at 4096 cells), and restoring a cached state moves ~23 KB
# a token: worth it only for a clearly longer prefix.
COPY_MIN_TOKENS = 16

Tokens = list[int] | tuple[int, ...]


def reusable(seq: Sequence, config: SchedulerConfig) -> list[int]:
    """The tokens of `seq` whose KV another sequence may start from: in exact mode
    only prompt positions of a prompt computed in full-size chunks. A whole-state memory
    cannot be cut back to its prompt: all of it, or (exact mode, once decoded tokens are
    in it) nothing; its prompt's state was saved when the prompt was in (postprocess.py).
    Nothing shorter than the sequence's `kv_floor` (slots.window_floor)."""
    if not config.exact:
        held = seq.tokens[: seq.num_computed]
    elif seq.num_prompt_tokens < config.exact_min_rows or (
        config.whole_state and seq.num_computed > seq.num_prompt_tokens
    ):
        return []
    else:
        held = seq.tokens[: config.block_floor(min(seq.num_computed, seq.num_prompt_tokens))]
    # A sliding window's state that came through a blob cannot be cut back further.
    return held if len(held) >= seq.kv_floor else []


def reuse_limit(num_tokens: int, config: SchedulerConfig) -> int:
    """The most prompt tokens a sequence of `num_tokens` may start from: the last
    `config.tail_rows` are computed again (at least the last: its logits are sampled)."""
    return config.block_floor(num_tokens - config.tail_rows)


def padded_keep(num_tokens: int, keep: int, config: SchedulerConfig) -> int:
    """`keep` cut back so that a warm start of `config.pad_from`..63 new rows computes a
    whole flash tile instead (engine/plan.py pad_from). A prompt under two tiles keeps
    its start: its rows are few and its stream short, so a tile's worth computed again
    would cost, not save."""
    new_rows = num_tokens - keep
    if not config.pad_from or keep == 0 or num_tokens < 2 * FLASH_TILE_ROWS:
        return keep
    if config.pad_from <= new_rows < FLASH_TILE_ROWS:
        return num_tokens - FLASH_TILE_ROWS
    return keep


@dataclass(slots=True)
class _Prefix:
    """Where a new sequence's reusable prefix comes from."""

    slot: int
    length: int = 0
    copy_from: int | None = None
    restore: bool = False
    seen: int = 0  # the longest agreement with any source (for checkpoints)
    floor: int = 0  # the shortest prefix the slot's KV may be cut to after this start


class Placer:
    def __init__(self, config: SchedulerConfig, slots: SlotTable):
        self.config = config
        self.slots = slots

    def place(self, seq: Sequence, running: list[Sequence], ops: list[KvOp]) -> bool:
        """Give `seq` a slot and the longest reusable prefix; False if no slot is free."""
        slots = self.slots
        session = seq.session_id if self.config.keeps_prefixes else None
        own = session is not None and session in slots.pins
        if own:
            assert session is not None
            slot = slots.pins[session]
            if slot not in slots.free:
                return False  # cannot happen: the scheduler defers it (`_session_slot_busy`)
            slots.touch(session)
            candidates = [slot]
        else:
            candidates = slots.unpinned_free()
            if not candidates:
                reclaimed = slots.reclaim(ops)
                if reclaimed is None:
                    return False
                candidates = [reclaimed]
        # Prompt log-probabilities need the logits of every prompt token: no reuse.
        reuse = seq.request.prompt_logprobs is None
        prefix = self._best_prefix(seq, candidates, running) if reuse else _Prefix(min(candidates))
        slot = prefix.slot
        # The last tail_rows prompt tokens are computed again (engine/plan.py); n > 1
        # choices copying their leader only need the last one (its logits, to sample).
        limit = reuse_limit(len(seq.tokens), self.config)
        sibling = seq.leader is not None and prefix.copy_from == seq.leader.slot
        if sibling:
            limit = len(seq.tokens) - 1
        keep = max(0, min(prefix.length, limit))
        if not sibling:
            keep = self.config.block_floor(padded_keep(len(seq.tokens), keep, self.config))
        if seq.request.media:  # an image is computed whole or reused whole
            keep = whole_image_keep(seq.tokens, keep, self.config.block_floor, prefix.floor)
        had_resident = slots.take(slot, session)
        if prefix.restore:
            assert seq.cache_hit is not None
            ops.extend((Drop(slot), Restore(seq, slot, seq.cache_hit, keep)))
        elif prefix.copy_from is not None:
            ops.extend((Copy(prefix.copy_from, slot, seq), Drop(slot, keep, seq)))
        elif had_resident or own:
            ops.append(Drop(slot, keep, seq))
        seq.kv_floor = prefix.floor if keep else 0
        if self.config.saves_checkpoints:
            seq.checkpoint = self._checkpoint(seq, keep, prefix.seen)
        if seq.num_output_tokens == 0:  # first admission (not a preempted sequence's)
            seq.num_cached = seq.num_saved = keep
            seq.hit_kind = _hit_kind(keep, prefix.length, seq.num_prompt_tokens, own)
            tier = seq.cache_hit.tier if prefix.restore and seq.cache_hit else "slot"
            seq.hit_source = "none" if keep == 0 else tier
        seq.cache_hit = None  # the state bytes are no longer needed past this point
        seq.slot = slot
        seq.num_computed = keep
        return True

    def _best_prefix(
        self, seq: Sequence, candidates: list[int], running: list[Sequence]
    ) -> _Prefix:
        """The candidate slot holding the longest prefix of `seq` (else the lowest: busy
        slots then stay contiguous, see `Scheduler.schedule`), unless a clearly longer prefix can
        be copied from another slot or restored from the cache."""
        slots, salt, config = self.slots, seq.salt, self.config
        best = _Prefix(min(candidates))
        usable = self._usable(seq, best)
        for slot in candidates:  # cells in place: cut anywhere above the resident's floor
            resident = slots.resident.get(slot)
            if resident is not None and resident.salt == salt:
                length = usable(resident.tokens, resident.floor)
                if length > best.length:
                    best.slot, best.length, best.floor = slot, length, resident.floor
        n_swa = config.n_swa  # what comes through a state blob: slots.window_floor
        if config.keeps_prefixes:
            threshold = best.length + COPY_MIN_TOKENS - 1
            sources = [
                (s.slot, s.tokens[: s.num_computed] if s is seq.leader else reusable(s, config),
                 s.kv_floor)
                for s in running
                if s.salt == salt
            ]  # fmt: skip
            sources += [
                (slot, r.tokens, r.floor)
                for slot, r in slots.resident.items()
                if slot not in candidates and r.salt == salt
            ]
            for source, held, floor in sources:
                cap = len(seq.tokens) - 1 if source == _slot(seq.leader) else None
                floor = max(floor, window_floor(len(held), n_swa, config.exact))
                length = usable(held, floor, cap)
                if length > threshold:
                    best.length, best.copy_from, best.floor = length, source, floor
                    threshold = length
        hit = seq.cache_hit
        if hit is not None:
            floor = window_floor(len(hit.tokens), n_swa, config.exact)
            length = usable(hit.tokens, floor)
            if length >= best.length + COPY_MIN_TOKENS:
                best.length, best.copy_from, best.restore, best.floor = length, None, True, floor
        return best

    def _usable(self, seq: Sequence, best: _Prefix) -> Callable[..., int]:
        """How many of a source's tokens `seq` may start from: their common prefix, if a
        cut there (at most at `reuse_limit`, or `cap`) keeps at least `floor` of them, else
        0. A whole-state memory cannot be cut at all: the source must be a prefix of the
        prompt within the limit. Notes in `best.seen` how far sources and prompt agree."""
        tokens, config = seq.tokens, self.config
        limit = reuse_limit(len(tokens), config)

        def usable(held: Tokens, floor: int, cap: int | None = None) -> int:
            shared = common_prefix(list(held), tokens)
            best.seen = max(best.seen, shared)
            if config.whole_state:
                floor = max(floor, len(held))
            return shared if min(shared, limit if cap is None else cap) >= floor else 0

        return usable

    def _checkpoint(self, seq: Sequence, keep: int, seen: int) -> int:
        """Whole states and sliding windows (ModelFamily.blob_bound): where to save a
        state on the way through this prompt (0: nowhere). Another source agreed with this
        prompt for `seen` tokens but could not lend its state (longer, and not to be cut
        back): the next prompt with that head (agents on one system prompt, a tool
        catalogue) restores the saved state instead. On a block
        boundary at or before what this prompt may reuse itself (`reuse_limit`), so that
        prompts diverging a few tokens apart share it; far enough from `keep` for exact
        mode's full-size chunks."""
        align = self.config.checkpoint_tokens
        if align <= 0:
            return 0
        at = min(seen, reuse_limit(len(seq.tokens), self.config)) // align * align
        least = self.config.exact_min_rows if self.config.exact else 1
        return at if at - keep >= least else 0


def _slot(seq: Sequence | None) -> int | None:
    return seq.slot if seq is not None else None


def _hit_kind(reused: int, found: int, num_prompt: int, own_session: bool) -> str:
    """cold: nothing reused; session: its own pinned slot; exact: the whole prompt was
    found (even if, for exactness, its tail is computed again); partial: a prefix."""
    if reused == 0:
        return "cold"
    if own_session:
        return "session"
    return "exact" if found >= num_prompt - 1 else "partial"
