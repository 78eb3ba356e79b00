"""The vocabulary of scheduling: what a step computes (`Chunk`), the KV work before it
(`KvPlan`), and the scheduler's settings, which satisfy the exact-reuse rules
(engine/exact_rules.py).

Pure data and arithmetic, on the engine thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.exact_rules import (
    CPU_ROW_BY_ROW,
    CPU_TILE_PAYS,
    EXACT_ROW_BLOCK,
    FLASH_TILE_ROWS,
    GPU_KERNELS,
    PAD_FROM_ROWS,
    WINDOW_SOLO_ROWS,
)
from engine.sequence import Sequence
from engine.thread.slots import KvOp

# Where prompts diverge, states are saved on multiples of 64 tokens: the alignment they
# had while the cache's block was 64 (a finer block finds them all the same).
CHECKPOINT_ALIGN = 64


def checkpoint_tokens(block_tokens: int) -> int:
    """The multiple checkpoints land on: CHECKPOINT_ALIGN rounded up to the cache's block,
    so that a lookup, which finds states through whole blocks, finds every one."""
    return -(-CHECKPOINT_ALIGN // block_tokens) * block_tokens


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
    """KV cache work to do, in order, before a step runs (see engine/thread/slots.py)."""

    ops: list[KvOp] = field(default_factory=list)


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
    # A recurrent or hybrid memory (engine/family.py): a sequence's state is kept whole or
    # not at all, so reuse starts only from a state made from exactly a prefix of the
    # prompt, and states are saved where prompts were seen to diverge (placement.py).
    whole_state: bool = False
    checkpoint_tokens: int = 0  # those saves land on multiples of this (checkpoint_tokens())
    # The model's sliding window (0: none): a state that comes through a blob keeps only
    # its last n_swa positions' window cells (slots.window_floor).
    n_swa: int = 0
    flash_attn: bool = False  # the context's (warm_tail)
    # The CPU's padding rule, measured (warm_tail): CPU_TILE_PAYS where a padded tile was
    # measured faster for every warm chunk (AMX), CPU_ROW_BY_ROW elsewhere, GPU_KERNELS
    # where the model runs on a GPU (its own attention kernels: never padded).
    cpu: str = CPU_ROW_BY_ROW
    # The vision projector's identity (engine/llama/vision.py), in every image id of a
    # prompt: where each image sits, so a chunk never ends inside one (engine/media.py).
    projector: str = ""

    @property
    def tail_rows(self) -> int:
        """The prompt rows every warm start computes again (placement.reuse_limit): the
        exact rows in exact mode, else the last row (its logits are sampled)."""
        return self.exact_min_rows if self.exact else 1

    @property
    def pad_from(self) -> int:
        """0, or the fewest new rows of a warm start that are padded to a whole flash
        tile, computed in a decode of their own (placement.padded_keep, solo_rows): a warm
        chunk of under FLASH_TILE_ROWS rows goes row by row over its whole stream, so
        computing up to 63 cached tokens again can be the faster start. Measured
        (docs/benchmarks.md "The warm tail"): on a Xeon with AMX the tile pays for any
        chunk (16 agents on 4 slots: 162.5 s with one row, 106.1 s with the tile); on an
        AMD EPYC it costs what 37-45 rows cost row by row, from 1k to 7k cells of stream
        (bench/step_cost.py --tail), so there only chunks of PAD_FROM_ROWS+ are padded.
        Not where a state cannot be cut back at will (a whole state, a window's floor):
        there padding would cost reuse, not rows; nor in exact mode (its own rows)."""
        if self.exact or not self.cpu_flash_streams or self.whole_state or self.n_swa > 0:
            return 0
        return 1 if self.cpu == CPU_TILE_PAYS else PAD_FROM_ROWS

    @property
    def cpu_flash_streams(self) -> bool:
        """Flash attention on a CPU, with a KV stream per slot: where the step shapes
        measured for the warm tail (pad_from) and windowed chunks (solo_rows) hold."""
        return self.flash_attn and self.cpu != GPU_KERNELS and self.keeps_prefixes

    @property
    def warm_tail(self) -> tuple[int, str]:
        """The most prompt rows a warm start computes again, and why: what /v1/status
        shows."""
        if self.exact:
            return self.exact_min_rows, "exact_reuse: the rows that give the cold logits"
        if not self.flash_attn:
            return 1, "flash attention off: a short chunk runs the same kernels"
        if self.cpu == GPU_KERNELS:
            return 1, "on a GPU: its attention kernels have no row-by-row path to avoid"
        if self.pad_from == 0:
            return 1, "no KV stream per slot to cut back at will"
        if self.pad_from == 1:
            return FLASH_TILE_ROWS, (
                "a CPU with AMX: every warm chunk under 64 rows is padded to flash "
                "attention's tile (measured faster: agents 0.65x)"
            )
        return FLASH_TILE_ROWS, (
            f"a CPU without AMX: warm chunks of {PAD_FROM_ROWS}-63 rows are padded to flash "
            "attention's 64-row tile, shorter ones are not (measured: the tile costs what "
            "37-45 rows cost row by row)"
        )

    @property
    def row_block(self) -> int:
        """Exact mode: chunks start, and warm starts cut, on multiples of this (above)."""
        return EXACT_ROW_BLOCK if self.exact and not self.whole_state else 1

    def block_floor(self, num_tokens: int) -> int:
        """`num_tokens` rounded down to row_block: the one home of that rounding."""
        return num_tokens - num_tokens % self.row_block

    @property
    def solo_rows(self) -> int:
        """Chunks of this many rows get a llama_decode of their own (engine/thread/runner.py);
        0: none. With a KV stream per slot, llama.cpp cuts a batch into ubatches holding
        the same number of rows of each sequence, so a chunk beside decode rows would lose
        rows to one-row ubatches: other kernels (exact reuse), the slow path (a warm
        tail's tile, above), and on sliding-window models a slower step than two
        (measured, engine/exact_rules.py WINDOW_SOLO_ROWS: a long prompt prefilled while
        another slot generates)."""
        if self.pad_from:
            return FLASH_TILE_ROWS
        tail = self.tail_rows
        if tail > 1 and self.keeps_prefixes:
            return tail
        windowed = self.n_swa > 0 and not self.whole_state
        return WINDOW_SOLO_ROWS if windowed and self.cpu_flash_streams else 0

    @property
    def window_recut(self) -> int:
        """Exact mode, a sliding window at least as long as the recomputed tail (and not a
        whole state): how many positions before its own window a saved state's blob also
        carries window cells for (engine/thread/window_keep.py), so that the state saved
        at a prompt's end can be cut back to a later turn's reuse limit, which lies at most
        tail_rows + EXACT_ROW_BLOCK - 1 before it. 0: states are saved as llama.cpp writes
        them (a shorter window: the tail checkpoint's cells do not reach the end's)."""
        reach = self.tail_rows + EXACT_ROW_BLOCK
        if not self.exact or self.whole_state or self.n_swa < reach:
            return 0
        return reach

    @property
    def saves_checkpoints(self) -> bool:
        """States are saved on the way through a prompt (placement.py `_checkpoints`)
        where a state from a blob serves only prompts that extend it: a whole state, a
        window (slots.window_floor)."""
        return self.whole_state or self.n_swa > 0

    @property
    def keeps_prefixes(self) -> bool:
        """Finished sequences leave their KV for reuse: with a stream per slot, or a
        single slot (in a unified pool shared by several, resident cells would compete
        with running sequences)."""
        return self.n_ctx_seq < self.n_ctx or self.num_slots == 1


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of two token lists."""
    n = min(len(a), len(b))
    i = 0
    while i + 256 <= n and a[i : i + 256] == b[i : i + 256]:  # whole blocks at C speed
        i += 256
    while i < n and a[i] == b[i]:
        i += 1
    return i
