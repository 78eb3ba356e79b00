"""Which tokens go into the next `llama_decode`: pure policy, no llama.cpp.

One step carries a decode row for every decoding sequence first, then prefill chunks of
the others, oldest first, under a per-step token budget and a per-chunk cap. Decode rows
are never dropped for a prefill, so a long prompt delays running streams by at most one
chunk per step, never stalls them.

The KV cache holds `n_ctx` cells. With one stream per slot (the default) a sequence
simply owns `n_ctx_seq` of them. With a unified cache the cells are one pool: a sequence
is admitted when its tokens fit beside everything already admitted, and when decoding
grows the running set past the pool, the newest sequence is preempted (its cells freed,
its tokens re-prefilled later) so the older ones can finish: the vLLM policy.

With one stream per slot, a finished sequence leaves its KV in its slot, and a new
sequence starts from the longest prefix of its prompt it can find, in this order of
cost: its own slot's resident tokens (a free slot, or its session's pinned slot), a copy
of another slot's KV stream (busy or free), or a state restored from the prefix cache.
Prefixes are only shared between requests with the same cache salt.

A sticky session pins its slot between requests, so its next turn prefills only what
was added. When a request needs a slot and none is free and unpinned, the least
recently used idle session gives its slot up (its KV is saved to the cache first, so it
resumes warm). A session with a request in flight is never reclaimed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.sequence import SeqStatus, Sequence
from engine.slots import Copy, Drop, KvOp, Resident, Restore, SlotTable
from engine.speculation import Drafter
from engine.stats import StepCounters


@dataclass(frozen=True, slots=True)
class Chunk:
    """`length` pending tokens of `seq` starting at `start`; `sample` if they end the list.

    A decoding sequence's chunk may carry `draft` tokens after its one pending token
    (speculative decoding, see engine/speculation.py): `length` counts them too."""

    seq: Sequence
    start: int
    length: int
    sample: bool
    draft: tuple[int, ...] = ()


@dataclass(slots=True)
class KvPlan:
    """KV cache work to do, in order, before a step runs (see engine/slots.py)."""

    ops: list[KvOp] = field(default_factory=list)


# Exact reuse. llama.cpp computes a sequence's rows with other kernels when a step holds
# few of them than when it holds many, so a position's KV and logits depend on the size
# of the step that computed them. Measured on this build with bench/batch_invariance.py
# (default model, a KV stream per slot, repacked weights, prompts of 512..4000 tokens,
# a prompt's last k rows computed again vs the whole prompt in one step):
# - flash attention on: every step of fewer than 64 rows of a sequence differs (max
#   |dlogit| 0.31-0.60), 64+ rows are identical;
# - flash attention off: steps of 2+ rows are identical, a one-row step differs (0.19-0.35);
# - a token decoded one row per step (alone or beside 3 other sequences) has other KV
#   than the same token prefilled: reusing 32 of them moved the next logits by 0.38-0.70
#   (flash attention off).
# So to make a warm start give exactly the cold output, prefill chunks of a prompt of
# `min_rows`+ tokens are never smaller than `min_rows`, each runs alone in its decode
# (engine/runner.py), only prompt positions (never decoded ones) are reused, and at
# least the last `min_rows` prompt tokens are computed again.


def exact_min_rows(flash_attn: bool) -> int:
    """The fewest rows of one sequence a step must compute to give exactly the KV and
    logits of one big step (see above): the one home of this rule."""
    return 64 if flash_attn else 2


def exact_min_chunk(min_rows: int) -> int:
    """The least prefill room per step that exact mode needs: a prompt of
    min_rows+1 .. 2*min_rows-1 pending tokens cannot be cut into two chunks of
    `min_rows`+ rows, so it must fit whole. With less room such a prompt would wait for
    ever (refused at construction instead)."""
    return 2 * min_rows


# Copying a slot's KV stream moves the whole stream (all n_ctx_seq cells of every layer,
# ~94 MB for the default model at 4096 cells), and restoring a cached state moves ~23 KB
# a token: worth it only for a clearly longer prefix.
COPY_MIN_TOKENS = 16


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    num_slots: int
    n_ctx: int  # KV cells in all
    n_ctx_seq: int  # KV cells one sequence may use (n_ctx when the cache is unified)
    step_tokens: int  # token budget of one llama_decode
    prefill_chunk: int  # most prompt tokens of one sequence in one step
    exact: bool = True  # reuse only what reproduces the cold output exactly (see above)
    exact_min_rows: int = 64  # exact_min_rows(flash_attn) of the context
    speculative: bool = False  # draft tokens by prompt lookup, unless a request says otherwise

    @property
    def keeps_prefixes(self) -> bool:
        """Finished sequences leave their KV for reuse: with a stream per slot, or a
        single slot (in a unified pool shared by several, resident cells would compete
        with running sequences)."""
        return self.n_ctx_seq < self.n_ctx or self.num_slots == 1


# The least settings a scheduler works with; the server's config validation asks these
# too, so a configuration it accepts is one the engine can run (issue 17).
def least_step_tokens(num_slots: int, exact: bool, min_rows: int) -> int:
    """A row per slot; in exact mode the oldest prefilling sequence shares the step with
    at most num_slots - 1 decode rows and must still get exact_min_chunk(min_rows)."""
    return exact_min_chunk(min_rows) + num_slots - 1 if exact else num_slots


def least_prefill_chunk(exact: bool, min_rows: int) -> int:
    return exact_min_chunk(min_rows) if exact else 1


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of two token lists."""
    n = min(len(a), len(b))
    i = 0
    while i + 256 <= n and a[i : i + 256] == b[i : i + 256]:  # whole blocks at C speed
        i += 256
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _slot_of(chunk: Chunk) -> int:
    return chunk.seq.slot if chunk.seq.slot is not None else -1


@dataclass(slots=True)
class _Prefix:
    """Where a new sequence's reusable prefix comes from."""

    slot: int
    length: int = 0
    copy_from: int | None = None
    restore: bool = False


class Scheduler:
    def __init__(self, config: SchedulerConfig, counters: StepCounters | None = None):
        least = least_prefill_chunk(config.exact, config.exact_min_rows)
        if config.prefill_chunk < least:
            raise ValueError(f"prefill_chunk must be at least {least}")
        least = least_step_tokens(config.num_slots, config.exact, config.exact_min_rows)
        if config.step_tokens < least:
            raise ValueError(f"step_tokens must be at least {least}")
        self.config = config
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order
        # Shared with the worker, and with the scheduler that replaces this one after a
        # rebuild (engine/stats.py): its preemption and reclaim counts carry on.
        self.counters = counters if counters is not None else StepCounters()
        self.slots = SlotTable(config.num_slots, config.keeps_prefixes, self.counters)
        self._lora_turns: dict[tuple[tuple[str, float], ...], int] = {}  # set -> last step
        self._num_steps = 0

    # -- queries ---------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def kv_cells_committed(self) -> int:
        """Cells the running sequences will occupy once their pending tokens are in."""
        return sum(len(s.tokens) for s in self.running)

    @property
    def kv_cells_used(self) -> int:
        return sum(s.num_computed for s in self.running)

    def find(self, request_id: str) -> Sequence | None:
        for seq in self.running:
            if seq.request_id == request_id:
                return seq
        for seq in self.waiting:
            if seq.request_id == request_id:
                return seq
        return None

    # -- mutations -------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def reusable(self, seq: Sequence) -> list[int]:
        """The tokens of `seq` whose KV another sequence may start from: in exact mode
        only prompt positions of a prompt computed in full-size chunks."""
        if not self.config.exact:
            return seq.tokens[: seq.num_computed]
        if seq.num_prompt_tokens < self.config.exact_min_rows:
            return []
        return seq.tokens[: min(seq.num_computed, seq.num_prompt_tokens)]

    def remove(self, seq: Sequence, *, keep_kv: bool = True, saved: bool = False) -> Drop | None:
        """Take `seq` out (finished or aborted), freeing its slot.

        Returns the KV the caller must drop: all of the slot's, or (when its prefix
        stays resident for reuse) the positions past `reusable(seq)`. `saved`: the cache
        already has the resident prefix."""
        slot = seq.slot
        drop = None
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
            assert slot is not None
            self.slots.free.append(slot)
            if keep_kv and self.config.keeps_prefixes:
                tokens = self.reusable(seq)
                self.slots.resident[slot] = Resident(tokens, seq.salt, saved)
                if len(tokens) < seq.num_computed:
                    drop = Drop(slot, len(tokens))
            else:
                drop = Drop(slot)
                if seq.session_id is not None and self.slots.pins.get(seq.session_id) == slot:
                    self.slots.unpin(seq.session_id)
        elif seq.status is SeqStatus.WAITING:
            self.waiting.remove(seq)
        seq.status = SeqStatus.FINISHED
        seq.slot = None
        return drop

    def preempt_newest(self) -> int:
        """Send the most recently admitted sequence back to the head of the queue.
        Returns its former slot, whose KV cells the caller must drop."""
        seq = self.running.pop()
        slot = seq.slot
        assert slot is not None
        self.slots.free.append(slot)
        seq.slot = None
        seq.num_computed = 0
        seq.status = SeqStatus.WAITING
        self.waiting.appendleft(seq)
        self.counters.num_preemptions += 1
        return slot

    def schedule(self) -> tuple[list[Chunk], KvPlan]:
        """Plan the next step: the chunks to decode, and the KV work (saves, restores,
        prefix copies, dropped tails, preempted sequences) to do before it."""
        kv = KvPlan([Drop(slot) for slot in self._make_room()])
        self._admit(kv)
        chunks: list[Chunk] = []
        budget = self.config.step_tokens
        free_cells = self.config.n_ctx - self.kv_cells_used
        decoding = [seq for seq in self.running if seq.is_decoding]
        spare = budget - len(decoding)  # drafts may use what one row per sequence leaves
        for seq in decoding:
            draft = self._draft(seq, min(spare, free_cells - 1))
            chunks.append(Chunk(seq, seq.num_computed, 1 + len(draft), True, draft))
            budget -= 1 + len(draft)
            spare -= len(draft)
            free_cells -= 1 + len(draft)
        for seq in self.running:
            if budget <= 0 or free_cells <= 0:
                break
            if seq.is_decoding or seq.num_pending == 0:
                continue
            length = self._chunk_length(seq, min(self.config.prefill_chunk, budget, free_cells))
            if length == 0:
                continue
            # A request with max_tokens 0 only scores its prompt: nothing to sample.
            sample = length == seq.num_pending and seq.request.max_tokens != 0
            chunks.append(Chunk(seq, seq.num_computed, length, sample))
            budget -= length
            free_cells -= length
        chunks = self._one_adapter_set(chunks)
        # With a KV stream per slot, llama.cpp splits a batch into ubatches of sequences
        # with consecutive ids, scanning rows in order: rows sorted by slot make one
        # ubatch of a step where any other order could make several.
        chunks.sort(key=_slot_of)
        return chunks, kv

    def _one_adapter_set(self, chunks: list[Chunk]) -> list[Chunk]:
        """The chunks of one LoRA adapter set only: llama.cpp applies one set to a whole
        context, so sequences with different sets cannot share a decode. The sets take
        turns, the one that waited longest first (steps alternate between them)."""
        sets = {c.seq.lora for c in chunks}
        if len(sets) > 1:
            turn = min(sets, key=lambda key: self._lora_turns.get(key, -1))
            chunks = [c for c in chunks if c.seq.lora == turn]
        if chunks:
            self._num_steps += 1
            self._lora_turns[chunks[0].seq.lora] = self._num_steps
            if len(self._lora_turns) > 4 * self.config.num_slots:  # forget sets long gone
                live = {s.lora for s in self.running}
                self._lora_turns = {k: v for k, v in self._lora_turns.items() if k in live}
        return chunks

    def _draft(self, seq: Sequence, room: int) -> tuple[int, ...]:
        """Draft tokens to verify after `seq`'s pending one: never more than the request
        may still generate after it, nor than its context can hold."""
        wanted = seq.request.speculative
        if not (self.config.speculative if wanted is None else wanted):
            return ()
        if seq.drafter is None:
            seq.drafter = Drafter()
        limit = min(room, self.config.n_ctx_seq - len(seq.tokens) - 1)
        if seq.request.max_tokens is not None:
            limit = min(limit, seq.request.max_tokens - seq.num_output_tokens - 1)
        return seq.drafter.propose(seq.tokens, limit)

    def _chunk_length(self, seq: Sequence, room: int) -> int:
        """How many pending tokens of `seq` to prefill now, at most `room`; 0: wait."""
        pending, least = seq.num_pending, self.config.exact_min_rows
        length = min(pending, room)
        if not self.config.exact or length == pending or pending < least:
            return length
        if pending - length < least:
            length = pending - least  # leave a full-size last chunk
        return length if length >= least else 0

    def _make_room(self) -> list[int]:
        freed = []
        while len(self.running) > 1 and self.kv_cells_committed > self.config.n_ctx:
            freed.append(self.preempt_newest())
        return freed

    def _admit(self, kv: KvPlan) -> None:
        committed = self.kv_cells_committed
        deferred: list[Sequence] = []
        while self.waiting:
            seq = self.waiting[0]
            if self._waits_for_leader(seq) or self._session_slot_busy(seq):
                deferred.append(self.waiting.popleft())
                continue
            if self.running and committed + len(seq.tokens) > self.config.n_ctx:
                break  # FIFO: later arrivals do not overtake a large one
            if not self._place(seq, kv.ops):
                break
            self.waiting.popleft()
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            committed += len(seq.tokens)
        self.waiting.extendleft(reversed(deferred))

    def _session_slot_busy(self, seq: Sequence) -> bool:
        """The session's pinned slot still runs its previous request (the server allows
        one request per session, so only a bug gets here): that request waits, and
        nobody behind it does."""
        session = seq.session_id
        slot = self.slots.pins.get(session) if session is not None else None
        return slot is not None and slot not in self.slots.free

    def _waits_for_leader(self, seq: Sequence) -> bool:
        """n > 1: the later choices wait until the first has its prompt in the KV, then
        copy it (see `_best_prefix`) rather than prefill it again."""
        leader = seq.leader
        return (
            leader is not None
            and self.config.keeps_prefixes
            and leader.status is not SeqStatus.FINISHED
            and not leader.prompt_done
        )

    def _place(self, seq: Sequence, ops: list[KvOp]) -> bool:
        """Give `seq` a slot and the longest reusable prefix; False if no slot is free."""
        slots = self.slots
        session = seq.session_id if self.config.keeps_prefixes else None
        own = session is not None and session in slots.pins
        if own:
            assert session is not None
            slot = slots.pins[session]
            if slot not in slots.free:
                return False  # cannot happen: `_admit` defers it (`_session_slot_busy`)
            slots.pins.move_to_end(session)
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
        prefix = self._best_prefix(seq, candidates) if reuse else _Prefix(min(candidates))
        slot = prefix.slot
        # At least the last token is computed again: its logits are needed to sample.
        # In exact mode, the last exact_min_rows prompt tokens (see above); n > 1
        # choices copying their leader only need the last one.
        limit = len(seq.tokens) - 1
        sibling = seq.leader is not None and prefix.copy_from == seq.leader.slot
        if self.config.exact and not sibling:
            limit = len(seq.tokens) - self.config.exact_min_rows
        keep = max(0, min(prefix.length, limit))
        had_resident = slots.resident.pop(slot, None) is not None
        if prefix.restore:
            assert seq.cache_hit is not None
            ops.extend((Drop(slot), Restore(seq, slot, seq.cache_hit, keep)))
        elif prefix.copy_from is not None:
            ops.extend((Copy(prefix.copy_from, slot, seq), Drop(slot, keep)))
        elif had_resident or own:
            ops.append(Drop(slot, keep))
        if seq.num_output_tokens == 0:  # first admission (not a preempted sequence's)
            seq.num_cached = seq.num_saved = keep
            seq.hit_kind = _hit_kind(keep, prefix.length, seq.num_prompt_tokens, own)
            tier = seq.cache_hit.tier if prefix.restore and seq.cache_hit else "slot"
            seq.hit_source = "none" if keep == 0 else tier
        seq.cache_hit = None  # the state bytes are no longer needed past this point
        slots.free.remove(slot)
        if session is not None:
            slots.pin(session, slot)
        seq.slot = slot
        seq.num_computed = keep
        return True

    def _best_prefix(self, seq: Sequence, candidates: list[int]) -> _Prefix:
        """The candidate slot holding the longest prefix of `seq` (else the lowest: busy
        slots then stay contiguous, see `schedule`), unless a clearly longer prefix can
        be copied from another slot or restored from the cache."""
        slots, salt, tokens = self.slots, seq.salt, seq.tokens
        best = _Prefix(min(candidates))
        for slot in candidates:
            resident = slots.resident.get(slot)
            if resident is not None and resident.salt == salt:
                length = common_prefix(resident.tokens, tokens)
                if length > best.length:
                    best = _Prefix(slot, length)
        if self.config.keeps_prefixes:
            threshold = best.length + COPY_MIN_TOKENS - 1
            sources = [
                (s.slot, s.tokens[: s.num_computed] if s is seq.leader else self.reusable(s))
                for s in self.running
                if s.salt == salt
            ]
            sources += [
                (slot, r.tokens)
                for slot, r in slots.resident.items()
                if slot not in candidates and r.salt == salt
            ]
            for source, held in sources:
                length = common_prefix(held, tokens)
                if length > threshold:
                    best, threshold = _Prefix(best.slot, length, source), length
        hit = seq.cache_hit
        if hit is not None and hit.num_matched >= best.length + COPY_MIN_TOKENS:
            best = _Prefix(best.slot, hit.num_matched, restore=True)
        return best

    def check_integrity(self) -> None:
        """Invariants; cheap enough for tests and idle moments."""
        busy = [s.slot for s in self.running if s.slot is not None]
        assert len(busy) == len(self.running), "a running sequence has no slot"
        self.slots.check(self.config.num_slots, busy)
        assert all(s.status is SeqStatus.WAITING and s.slot is None for s in self.waiting)
        assert all(s.status is SeqStatus.RUNNING for s in self.running)


def _hit_kind(reused: int, found: int, num_prompt: int, own_session: bool) -> str:
    """cold: nothing reused; session: its own pinned slot; exact: the whole prompt was
    found (even if, for exactness, its tail is computed again); partial: a prefix."""
    if reused == 0:
        return "cold"
    if own_session:
        return "session"
    return "exact" if found >= num_prompt - 1 else "partial"
