"""Placement: which slot a newly admitted sequence gets, and the longest prefix of its
prompt it can start from, in this order of cost: its own slot's resident tokens (a free
slot, or its session's pinned slot), a copy of another slot's KV stream (busy or free),
or a state restored from the prefix cache. Prefixes are only shared between requests
with the same cache salt.

Pure policy, no llama.cpp: it writes the slot table through its methods and appends the
KV operations the worker must run (engine/thread/slots.py). Engine thread only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.exact_rules import FLASH_TILE_ROWS
from engine.media import whole_image_keep
from engine.sequence import Sequence
from engine.thread.plan import SchedulerConfig, common_prefix
from engine.thread.slots import Copy, Drop, KvOp, Restore, SlotTable, window_floor
from engine.thread.window_keep import window_start

if TYPE_CHECKING:
    from collections.abc import Sequence as SeqType

    from cache import CacheHit, PrefixCache

# Copying a slot's KV stream moves the whole stream (all n_ctx_seq cells of every layer,
# ~94 MB for the default model at 4096 cells): worth it only for a clearly longer prefix.
COPY_MIN_TOKENS = 16
# Restoring a cached state writes every token of it (~23 KB a token for the default
# model, a few microseconds) where computing a token's KV costs milliseconds (3.8 ms a
# prompt token on the 2-core Xeon): a restore pays once it saves one token for each
# RESTORE_TOKENS_PER_SAVED tokens it writes, and never needs more than a copy does.
RESTORE_TOKENS_PER_SAVED = 256
# How many prompts placed lately the placer compares a new one with (Placer.recent): an
# agent's turns come a few requests apart; each comparison runs at C speed.
RECENT_PROMPTS = 16

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


def lookup_reach(num_tokens: int, config: SchedulerConfig, recut: bool = True) -> int:
    """How many of a prompt's tokens a cache lookup matches against. A blob-bound cache
    (PrefixCache.whole_states) returns the longest entry that is a proper prefix of what
    it is given, and such a state is usable only up to `reuse_limit`: under exact reuse
    the lookup is given one token past that limit, so that it returns the longest state
    this prompt can start from (a checkpoint, a shorter entry), not a longer one that
    placement must refuse. Where saved windows can be cut back over the recomputed rows
    (`window_recut`), the whole prompt: its longest stored prefix (a previous turn's
    end) serves, cut back to the limit, and where it cannot, `lookup_again`. Otherwise
    the whole prompt."""
    if not config.exact or not (config.whole_state or config.n_swa > 0):
        return num_tokens
    if recut and config.window_recut:
        return num_tokens
    return max(0, min(num_tokens, reuse_limit(num_tokens, config) + 1))


def lookup_again(hit: CacheHit, num_tokens: int, config: SchedulerConfig) -> int:
    """0, or how far a second lookup should reach: the first one reached past the
    prompt's reuse limit (`lookup_reach`) and found a state that cannot be cut back to
    it, where a shorter one may serve."""
    plain = lookup_reach(num_tokens, config, recut=False)
    if not config.window_recut or len(hit.tokens) < plain:
        return 0
    reach = config.block_floor(min(len(hit.tokens), reuse_limit(num_tokens, config)))
    return plain if hit_floor(hit, config) > reach else 0


def find_usable(
    cache: PrefixCache, prompt: SeqType[int], salt: str, config: SchedulerConfig, held: bool = False
) -> CacheHit | None:
    """The longest stored prefix `prompt` can start from: looked up as far as
    `lookup_reach`, and once more as far as `lookup_again` where the first look found a
    state that cannot be cut back to where the prompt needs. `held`: in RAM only
    (PrefixCache.lookup)."""
    hit = cache.lookup(prompt[: lookup_reach(len(prompt), config)], salt, held=held)
    again = lookup_again(hit, len(prompt), config) if hit is not None else 0
    return cache.lookup(prompt[:again], salt, held=held) if again else hit


def hit_floor(hit: CacheHit, config: SchedulerConfig) -> int:
    """The shortest prefix a cached state may be cut back to: slots.window_floor, or
    where saved states carry window cells further back (`window_recut`), the first
    position whose window the blob holds whole (engine/thread/window_keep.py)."""
    floor = window_floor(len(hit.tokens), config.n_swa)
    if config.window_recut and floor:
        first = window_start(hit.state)
        if first is not None:
            floor = min(floor, first + config.n_swa - 1)
    return floor


def restore_min_gain(num_tokens: int) -> int:
    """How many more prompt tokens than the best slot offers a restore of a state of
    `num_tokens` tokens must reuse to be chosen (RESTORE_TOKENS_PER_SAVED)."""
    return min(COPY_MIN_TOKENS, max(1, num_tokens // RESTORE_TOKENS_PER_SAVED))


def padded_keep(num_tokens: int, keep: int, config: SchedulerConfig) -> int:
    """`keep` cut back so that a warm start of `config.pad_from`..63 new rows computes a
    whole flash tile instead (engine/thread/plan.py pad_from). A prompt under two tiles keeps
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
    refused: str = ""  # why the source agreeing longest could not lend (COLD_REASONS)
    refused_at: int = 0  # how long that agreement was


class Placer:
    def __init__(self, config: SchedulerConfig, slots: SlotTable):
        self.config = config
        self.slots = slots
        # The prompts placed lately, by salt: where a new prompt diverges from one of
        # them, a state saved there serves the next prompt with that head (`_checkpoints`).
        # Slots and the cache show this too, but not under exact reuse on a whole state:
        # it keeps no slot once decoded, and the lookup returns only states it can use.
        self.recent: deque[tuple[str, tuple[int, ...]]] = deque(maxlen=RECENT_PROMPTS)

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
        found = seq.cache_hit is not None  # a stored prefix, whether usable or not
        prefix = self._best_prefix(seq, candidates, running) if reuse else _Prefix(min(candidates))
        slot = prefix.slot
        # The last tail_rows prompt tokens are computed again (engine/thread/plan.py); n > 1
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
            seen = max(prefix.seen, self._agreement(seq))
            seq.checkpoints = self._checkpoints(seq, keep, seen)
            self.recent.append((seq.salt, tuple(seq.tokens[: seq.num_prompt_tokens])))
        if seq.num_output_tokens == 0:  # first admission (not a preempted sequence's)
            seq.num_cached = seq.num_saved = keep
            seq.hit_kind = _hit_kind(keep, prefix.length, seq.num_prompt_tokens, own)
            tier = seq.cache_hit.tier if prefix.restore and seq.cache_hit else "slot"
            seq.hit_source = "none" if keep == 0 else tier
            seq.cold_reason = _cold_reason(keep, prefix, reuse, found)
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
                floor = max(floor, window_floor(len(held), n_swa))
                length = usable(held, floor, cap)
                if length > threshold:
                    best.length, best.copy_from, best.floor = length, source, floor
                    threshold = length
        hit = seq.cache_hit
        if hit is not None:
            floor = hit_floor(hit, config)
            length = usable(hit.tokens, floor)
            if length >= best.length + restore_min_gain(len(hit.tokens)):
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
            # The cut lands on a row block (exact mode), unless capped for a sibling.
            reach = config.block_floor(min(shared, limit)) if cap is None else min(shared, cap)
            if reach >= floor:
                return shared
            if shared > best.refused_at:  # nothing of it: say why (a silent miss otherwise)
                best.refused_at = shared
                best.refused = EXACT_TAIL if shared >= floor else self._longer()
            return 0

        return usable

    def _agreement(self, seq: Sequence) -> int:
        """The longest head `seq`'s prompt shares with a prompt placed lately that goes on
        otherwise (one it extends left its own states)."""
        tokens, longest = seq.tokens[: seq.num_prompt_tokens], 0
        for salt, prompt in self.recent:
            shared = common_prefix(list(prompt), tokens) if salt == seq.salt else 0
            if longest < shared < len(prompt):
                longest = shared
        return longest

    def _longer(self) -> str:
        """Why a state longer than the prompt's shared prefix cannot be cut back to it."""
        return LONGER_STATE if self.config.whole_state else WINDOW

    def _checkpoints(self, seq: Sequence, keep: int, seen: int) -> list[int]:
        """Whole states and sliding windows (ModelFamily.blob_bound): where to save states
        on the way through this prompt, ascending (empty: nowhere).

        Where prompts diverge: another source agreed with this prompt for `seen` tokens
        but could not lend its state (longer, and not to be cut back): the next prompt
        with that head (agents on one system prompt, a tool catalogue) restores the saved
        state instead. On a block boundary at or before what this prompt may reuse itself
        (`reuse_limit`), so that prompts diverging a few tokens apart share it.

        Under exact reuse also at this prompt's own `reuse_limit` (the tail checkpoint):
        a state cannot be cut back, and the state saved at the prompt's end serves only a
        prompt that adds at least the recomputed rows to it; an agent's next turn, which
        extends this prompt by a reply and a short tool result, or this same prompt sent
        again, may start exactly there (its own limit is never lower).

        Each at least exact mode's full-size chunk past `keep` and past the one before."""
        config = self.config
        least = config.exact_min_rows if config.exact else 1
        wanted = []
        align = config.checkpoint_tokens
        limit = reuse_limit(len(seq.tokens), config)
        if align > 0:
            wanted.append(min(seen, limit) // align * align)
        if config.exact and align > 0:
            wanted.append(limit)
        points: list[int] = []
        for at in sorted(set(wanted), reverse=True):  # the tail one first: it serves more
            if at - keep >= least and all(abs(at - p) >= least for p in points):
                points.append(at)
        return sorted(points)


def _slot(seq: Sequence | None) -> int | None:
    return seq.slot if seq is not None else None


# Why a request that found a stored prefix computed its prompt cold (Timings.cold_reason:
# the access log's cold_reason, /v1/status's requests_cold_why).
EXACT_TAIL = "exact_tail"  # it ends within the rows exact reuse computes again
LONGER_STATE = "longer_state"  # a whole state past the shared prefix: cannot be cut back
WINDOW = "window"  # a window's state from a blob, past the shared prefix: cannot be cut back
SHORT = "short"  # too short to be worth a copy or a restore (COPY_MIN_TOKENS, restore_min_gain)
KV_OP_FAILED = "kv_op_failed"  # its restore, copy or cut failed (engine/thread/kvexec.py)


def _cold_reason(keep: int, prefix: _Prefix, reuse: bool, found: bool) -> str:
    """Why a sequence that some source agreed with reuses nothing ("": it reuses, or
    nothing agreed with it)."""
    if keep > 0 or not reuse or not (found or prefix.seen):
        return ""
    if prefix.length > 0:  # usable, but the prompt is all within the recomputed tail
        return EXACT_TAIL
    return prefix.refused or SHORT


def _hit_kind(reused: int, found: int, num_prompt: int, own_session: bool) -> str:
    """cold: nothing reused; session: its own pinned slot; exact: the whole prompt was
    found (even if, for exactness, its tail is computed again); partial: a prefix."""
    if reused == 0:
        return "cold"
    if own_session:
        return "session"
    return "exact" if found >= num_prompt - 1 else "partial"
