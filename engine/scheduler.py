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

With one stream per slot, a finished sequence leaves its KV in its slot. A new sequence
takes the free slot whose resident tokens share the longest prefix with its own, and
prefills only the rest (what llama-server calls cache_prompt): a repeated system prompt
or the earlier turns of a conversation are not computed again. When another slot, busy
or free, holds a clearly longer prefix, its KV stream is copied into the new slot first.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.sequence import SeqStatus, Sequence


@dataclass(frozen=True, slots=True)
class Chunk:
    """`length` pending tokens of `seq` starting at `start`; `sample` if they end the list."""

    seq: Sequence
    start: int
    length: int
    sample: bool


@dataclass(slots=True)
class KvPlan:
    """KV cache work to do before a step runs, in this order: copy the stream of slot
    `src` into slot `dst`, then drop each slot's cells from position `start` on."""

    copies: list[tuple[int, int]] = field(default_factory=list)  # (src, dst)
    drops: list[tuple[int, int]] = field(default_factory=list)  # (slot, start)


# Copying a slot's KV stream moves the whole stream (all n_ctx_seq cells of every layer,
# ~94 MB for the default model at 4096 cells): worth it only for a longer prefix.
COPY_MIN_TOKENS = 16


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    num_slots: int
    n_ctx: int  # KV cells in all
    n_ctx_seq: int  # KV cells one sequence may use (n_ctx when the cache is unified)
    step_tokens: int  # token budget of one llama_decode
    prefill_chunk: int  # most prompt tokens of one sequence in one step

    @property
    def keeps_prefixes(self) -> bool:
        """Finished sequences leave their KV for reuse (only with a stream per slot:
        in a unified pool, resident cells would compete with running sequences)."""
        return self.n_ctx_seq < self.n_ctx


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


class Scheduler:
    def __init__(self, config: SchedulerConfig):
        if config.step_tokens < config.num_slots:
            raise ValueError("step_tokens must be at least the number of slots")
        self.config = config
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order
        self.free_slots: list[int] = list(range(config.num_slots))
        self.resident: dict[int, list[int]] = {}  # free slot -> tokens whose KV it holds
        self.num_preemptions = 0

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

    def remove(self, seq: Sequence, *, keep_kv: bool = True) -> int | None:
        """Take `seq` out (finished or aborted); return the slot it held, now free.

        Returns None when the caller has nothing to drop: the sequence held no slot, or
        its KV stays resident for reuse. Otherwise the caller must drop the slot's KV."""
        slot = seq.slot
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
            assert slot is not None
            self.free_slots.append(slot)
            if keep_kv and self.config.keeps_prefixes:
                self.resident[slot] = seq.tokens[: seq.num_computed]
                slot = None
        elif seq.status is SeqStatus.WAITING:
            self.waiting.remove(seq)
        seq.status = SeqStatus.FINISHED
        seq.slot = None
        return slot

    def preempt_newest(self) -> int:
        """Send the most recently admitted sequence back to the head of the queue.
        Returns its former slot, whose KV cells the caller must drop."""
        seq = self.running.pop()
        slot = seq.slot
        assert slot is not None
        self.free_slots.append(slot)
        seq.slot = None
        seq.num_computed = 0
        seq.status = SeqStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
        return slot

    def schedule(self) -> tuple[list[Chunk], KvPlan]:
        """Plan the next step: the chunks to decode, and the KV work (prefix copies,
        dropped tails of reused slots, preempted sequences) to do before it."""
        kv = KvPlan(drops=[(slot, 0) for slot in self._make_room()])
        self._admit(kv)
        chunks: list[Chunk] = []
        budget = self.config.step_tokens
        free_cells = self.config.n_ctx - self.kv_cells_used
        for seq in self.running:
            if seq.is_decoding:
                chunks.append(Chunk(seq, seq.num_computed, 1, True))
                budget -= 1
                free_cells -= 1
        for seq in self.running:
            if budget <= 0 or free_cells <= 0:
                break
            if seq.is_decoding or seq.num_pending == 0:
                continue
            length = min(seq.num_pending, self.config.prefill_chunk, budget, free_cells)
            # A request with max_tokens 0 only scores its prompt: nothing to sample.
            sample = length == seq.num_pending and seq.request.max_tokens != 0
            chunks.append(Chunk(seq, seq.num_computed, length, sample))
            budget -= length
            free_cells -= length
        # With a KV stream per slot, llama.cpp splits a batch into ubatches of sequences
        # with consecutive ids, scanning rows in order: rows sorted by slot make one
        # ubatch of a step where any other order could make several.
        chunks.sort(key=_slot_of)
        return chunks, kv

    def _make_room(self) -> list[int]:
        freed = []
        while len(self.running) > 1 and self.kv_cells_committed > self.config.n_ctx:
            freed.append(self.preempt_newest())
        return freed

    def _admit(self, kv: KvPlan) -> None:
        committed = self.kv_cells_committed
        while self.waiting and self.free_slots:
            seq = self.waiting[0]
            if self.running and committed + len(seq.tokens) > self.config.n_ctx:
                break  # FIFO: later arrivals do not overtake a large one
            self.waiting.popleft()
            # Prompt log-probabilities need the logits of every prompt token: no reuse.
            reuse = seq.request.prompt_logprobs is None
            slot, reused, source = self._pick_slot(seq.tokens, reuse=reuse)
            # At least the last token is computed again: its logits are needed to sample.
            keep = min(reused, len(seq.tokens) - 1)
            if source is not None:
                kv.copies.append((source, slot))
                kv.drops.append((slot, keep))
                self.resident.pop(slot, None)
            elif self.resident.pop(slot, None):
                kv.drops.append((slot, keep))
            seq.slot = slot
            seq.num_computed = keep
            if seq.num_output_tokens == 0:
                seq.num_cached = keep
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            committed += len(seq.tokens)

    def _pick_slot(self, tokens: list[int], *, reuse: bool) -> tuple[int, int, int | None]:
        """Choose a free slot for `tokens`: the one holding the longest prefix of them,
        else the lowest (busy slots then stay contiguous, see `schedule`). If another
        slot holds a prefix longer by COPY_MIN_TOKENS, that slot is named as the source
        to copy from. Returns (slot, tokens reusable, source slot or None)."""
        best, best_len = min(self.free_slots), 0
        if not reuse:
            self.free_slots.remove(best)
            return best, 0, None
        for slot in self.free_slots:
            resident = self.resident.get(slot)
            if resident:
                length = common_prefix(resident, tokens)
                if length > best_len:
                    best, best_len = slot, length
        source, source_len = None, best_len + COPY_MIN_TOKENS - 1
        if self.config.keeps_prefixes:
            for seq in self.running:
                length = common_prefix(seq.tokens[: seq.num_computed], tokens)
                if length > source_len:
                    source, source_len = seq.slot, length
        if source is not None:
            best = min(self.free_slots)
            best_len = source_len
        self.free_slots.remove(best)
        return best, best_len, source

    def check_integrity(self) -> None:
        """Invariants; cheap enough for tests and idle moments."""
        slots = [s.slot for s in self.running]
        assert len(set(slots)) == len(slots), "two running sequences share a slot"
        assert not set(slots) & set(self.free_slots), "a running slot is also free"
        assert len(slots) + len(self.free_slots) == self.config.num_slots, "a slot leaked"
        assert all(s.status is SeqStatus.WAITING and s.slot is None for s in self.waiting)
        assert all(s.status is SeqStatus.RUNNING for s in self.running)
        assert set(self.resident) <= set(self.free_slots), "a busy slot has resident tokens"
