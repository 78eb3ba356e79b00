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

from engine.plan import SchedulerConfig, common_prefix
from engine.sequence import Sequence
from engine.slots import Copy, Drop, KvOp, Restore, SlotTable

# Copying a slot's KV stream moves the whole stream (all n_ctx_seq cells of every layer,
# ~94 MB for the default model at 4096 cells), and restoring a cached state moves ~23 KB
# a token: worth it only for a clearly longer prefix.
COPY_MIN_TOKENS = 16

Tokens = list[int] | tuple[int, ...]


def reusable(seq: Sequence, config: SchedulerConfig) -> list[int]:
    """The tokens of `seq` whose KV another sequence may start from: in exact mode
    only prompt positions of a prompt computed in full-size chunks. A whole-state memory
    cannot be cut back to its prompt: all of it, or (exact mode, once decoded tokens are
    in it) nothing; its prompt's state was saved when the prompt was in (postprocess.py)."""
    if not config.exact:
        return seq.tokens[: seq.num_computed]
    if seq.num_prompt_tokens < config.exact_min_rows:
        return []
    if config.whole_state and seq.num_computed > seq.num_prompt_tokens:
        return []
    return seq.tokens[: min(seq.num_computed, seq.num_prompt_tokens)]


def reuse_limit(num_tokens: int, config: SchedulerConfig) -> int:
    """The most prompt tokens a sequence of `num_tokens` may start from: the last is
    computed again (its logits are sampled); in exact mode the last exact_min_rows."""
    return num_tokens - (config.exact_min_rows if config.exact else 1)


@dataclass(slots=True)
class _Prefix:
    """Where a new sequence's reusable prefix comes from."""

    slot: int
    length: int = 0
    copy_from: int | None = None
    restore: bool = False
    seen: int = 0  # whole-state memories: the longest agreement with any source


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
        # At least the last token is computed again: its logits are needed to sample.
        # In exact mode, the last exact_min_rows prompt tokens (engine/plan.py); n > 1
        # choices copying their leader only need the last one.
        limit = reuse_limit(len(seq.tokens), self.config)
        sibling = seq.leader is not None and prefix.copy_from == seq.leader.slot
        if sibling:
            limit = len(seq.tokens) - 1
        keep = max(0, min(prefix.length, limit))
        had_resident = slots.take(slot, session)
        if prefix.restore:
            assert seq.cache_hit is not None
            ops.extend((Drop(slot), Restore(seq, slot, seq.cache_hit, keep)))
        elif prefix.copy_from is not None:
            ops.extend((Copy(prefix.copy_from, slot, seq), Drop(slot, keep, seq)))
        elif had_resident or own:
            ops.append(Drop(slot, keep, seq))
        if self.config.whole_state:
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
        slots, salt = self.slots, seq.salt
        usable = self._usable_length(seq)
        best = _Prefix(min(candidates))
        for slot in candidates:
            resident = slots.resident.get(slot)
            if resident is not None and resident.salt == salt:
                length = usable(resident.tokens, best)
                if length > best.length:
                    best = _Prefix(slot, length, seen=best.seen)
        if self.config.keeps_prefixes:
            threshold = best.length + COPY_MIN_TOKENS - 1
            config = self.config
            sources = [
                (s.slot, s.tokens[: s.num_computed] if s is seq.leader else reusable(s, config))
                for s in running
                if s.salt == salt
            ]
            sources += [
                (slot, r.tokens)
                for slot, r in slots.resident.items()
                if slot not in candidates and r.salt == salt
            ]
            for source, held in sources:
                length = usable(held, best)
                if length > threshold:
                    best, threshold = _Prefix(best.slot, length, source, seen=best.seen), length
        hit = seq.cache_hit
        if hit is not None and usable(hit.tokens, best) >= best.length + COPY_MIN_TOKENS:
            best = _Prefix(best.slot, hit.num_matched, restore=True, seen=best.seen)
        return best

    def _usable_length(self, seq: Sequence) -> Callable[[Tokens, _Prefix], int]:
        """How many of a source's tokens `seq` may start from (noting in `best.seen` how
        far the source and the prompt agree). Cells can be cut anywhere: the common
        prefix. A whole-state memory cannot be cut: all of the source if it is a prefix
        of the prompt no longer than `reuse_limit`, else nothing."""
        tokens = seq.tokens
        if not self.config.whole_state:
            return lambda held, best: common_prefix(list(held), tokens)
        limit = reuse_limit(len(tokens), self.config)

        def whole(held: Tokens, best: _Prefix) -> int:
            shared = common_prefix(list(held), tokens)
            best.seen = max(best.seen, shared)
            return shared if shared == len(held) and shared <= limit else 0

        return whole

    def _checkpoint(self, seq: Sequence, keep: int, seen: int) -> int:
        """Whole-state memories: where to save a state on the way through this prompt
        (0: nowhere). Another prompt agreed with this one for `seen` tokens but could not
        lend its state (it is longer): the next prompt with that head (agents on one
        system prompt, tool catalogue) restores the saved state instead. On a block
        boundary at or before what this prompt may reuse itself (`reuse_limit`), so that
        prompts diverging a few tokens apart share it; far enough from `keep` for exact
        mode's full-size chunks."""
        align = self.config.checkpoint_tokens
        if align <= 0:
            return 0
        at = min(seen, reuse_limit(len(seq.tokens), self.config)) // align * align
        least = self.config.exact_min_rows if self.config.exact else 1
        return at if at - keep >= least else 0


def _hit_kind(reused: int, found: int, num_prompt: int, own_session: bool) -> str:
    """cold: nothing reused; session: its own pinned slot; exact: the whole prompt was
    found (even if, for exactness, its tail is computed again); partial: a prefix."""
    if reused == 0:
        return "cold"
    if own_session:
        return "session"
    return "exact" if found >= num_prompt - 1 else "partial"
