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

from engine.exact_rules import least_prefill_chunk, least_step_tokens
from engine.media import image_spans, whole_image_chunk
from engine.sequence import SeqStatus, Sequence
from engine.speculation import Drafter
from engine.thread.admission import count_overtakes, rank_waiting, waits_for_shared_head
from engine.thread.placement import COPY_MIN_TOKENS, Placer, reusable
from engine.thread.plan import (
    Chunk,
    KvPlan,
    SchedulerConfig,
    common_prefix,
)
from engine.thread.slots import Drop, Resident, SlotTable
from engine.thread.stats import StepCounters

# Re-exported: the scheduling vocabulary lives in engine/thread/plan.py, placement in
# engine/thread/placement.py; callers (the worker, tests) import them from here too.
__all__ = [
    "COPY_MIN_TOKENS",
    "Chunk",
    "KvPlan",
    "Scheduler",
    "SchedulerConfig",
    "common_prefix",
]


def _slot_of(chunk: Chunk) -> int:
    return chunk.seq.slot if chunk.seq.slot is not None else -1


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
        # rebuild (engine/thread/stats.py): its preemption and reclaim counts carry on.
        self.counters = counters if counters is not None else StepCounters()
        self.slots = SlotTable(
            config.num_slots, config.keeps_prefixes, self.counters, config.n_swa, config.exact
        )
        self._placer = Placer(config, self.slots)
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
        """The tokens of `seq` whose KV another sequence may start from (placement.py)."""
        return reusable(seq, self.config)

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
            if keep_kv and self.config.keeps_prefixes:
                tokens = self.reusable(seq)
                floor = seq.kv_floor if tokens else 0
                self.slots.release(slot, Resident(tokens, seq.salt, saved, floor))
                if len(tokens) < seq.num_computed:
                    drop = Drop(slot, len(tokens))
            else:
                self.slots.release(slot)
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
        self.slots.release(slot)
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
            room = min(budget, free_cells)
            length = self._chunk_length(seq, min(self.config.prefill_chunk, room), room)
            if length == 0:
                continue
            # A request with max_tokens 0 only scores its prompt: nothing to sample; nor
            # does one whose thinking must close first (budget 0, the prompt inside it):
            # postprocess appends the close, sampled after in the next step.
            sample = length == seq.num_pending and seq.request.max_tokens != 0
            sample = sample and not seq.close_due
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
        thinking = seq.thinking.draft_room() if seq.thinking is not None else None
        if thinking is not None:  # a thinking budget may run out only on the step's last token
            limit = min(limit, thinking)
        return seq.drafter.propose(seq.tokens, limit)

    def _chunk_length(self, seq: Sequence, room: int, most: int) -> int:
        """How many pending tokens of `seq` to prefill now, at most `room`; 0: wait.
        A chunk stops at the sequence's checkpoint, if one is ahead (placement.py), and
        never inside an image: it ends before one, or takes it whole, up to `most` (the
        step's room) past `room` (engine/media.py `whole_image_chunk`)."""
        pending = seq.num_pending
        if seq.checkpoint > seq.num_computed:
            pending = seq.checkpoint - seq.num_computed
        length = self._fit(seq.num_computed, pending, room)
        if not seq.request.media or length == 0:
            return length
        digests = [m.digest for m in seq.request.media]
        spans = image_spans(seq.tokens, digests, self.config.projector)
        start = seq.num_computed

        def widen(rows: int) -> int:
            # A checkpoint inside the image is passed by (its state could serve no
            # prompt: a reuse never cuts an image); one past it still bounds the chunk.
            bound = pending if rows <= pending else seq.num_pending
            return self._widen(start, rows, bound)

        def fit(rows: int) -> int:
            return self._fit(start, pending, rows)

        return whole_image_chunk(spans, start, length, fit, widen, most)

    def _fit(self, start: int, pending: int, room: int) -> int:
        """The longest chunk from `start` of `pending` rows within `room` that exact reuse
        allows: at least exact_min_rows, a full-size last chunk, the next chunk starting
        on a row block (engine/exact_rules.py); 0: none. Without exact reuse,
        min(pending, room).
        (`start` is off a block only after a chunk ended at an image's end.)"""
        least = self.config.exact_min_rows
        length = min(pending, room)
        if not self.config.exact or length == pending or pending < least:
            return length
        if pending - length < least:
            length = pending - least  # leave a full-size last chunk
        length = self.config.block_floor(start + length) - start  # the next starts on a block
        return length if length >= least else 0

    def _widen(self, start: int, rows: int, pending: int) -> int:
        """The shortest chunk from `start` of at least `rows` of `pending` rows that exact
        reuse allows (the rules of `_fit`, rounding up): an image taken whole."""
        least = self.config.exact_min_rows
        if not self.config.exact or pending < least or rows >= pending:
            return min(rows, pending)
        end = start + rows
        length = max(end + (-end) % self.config.row_block - start, least)
        return pending if pending - length < least else length

    def _make_room(self) -> list[int]:
        freed = []
        while len(self.running) > 1 and self.kv_cells_committed > self.config.n_ctx:
            freed.append(self.preempt_newest())
        return freed

    def _admit(self, kv: KvPlan) -> None:
        """Admit from the queue (ranked: engine/thread/admission.py) while slots and KV allow."""
        if len(self.running) >= self.config.num_slots:
            return  # each running sequence holds a slot: none to give (and no ranking cost)
        rank_waiting(self.waiting, self.running, self.slots, self.config)
        committed = self.kv_cells_committed
        admitted: list[Sequence] = []
        deferred: list[Sequence] = []
        while self.waiting:
            seq = self.waiting[0]
            if (
                self._waits_for_leader(seq)
                or self._session_slot_busy(seq)
                or waits_for_shared_head(seq, self.running, self.slots, self.config)
            ):
                deferred.append(self.waiting.popleft())
                continue
            if self.running and committed + len(seq.tokens) > self.config.n_ctx:
                break  # nobody overtakes one that does not fit yet
            if not self._placer.place(seq, self.running, kv.ops):
                break
            self.waiting.popleft()
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            admitted.append(seq)
            committed += len(seq.tokens)
        self.waiting.extendleft(reversed(deferred))
        count_overtakes(self.waiting, admitted)

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
            and not self.config.whole_state  # its state holds the whole prompt: no use
            and leader.status is not SeqStatus.FINISHED
            and not leader.prompt_done
        )

    def check_integrity(self) -> None:
        """Invariants; cheap enough for tests and idle moments."""
        busy = [s.slot for s in self.running if s.slot is not None]
        assert len(busy) == len(self.running), "a running sequence has no slot"
        self.slots.check(self.config.num_slots, busy)
        assert all(s.status is SeqStatus.WAITING and s.slot is None for s in self.waiting)
        assert all(s.status is SeqStatus.RUNNING for s in self.running)
