"""The vocabulary of scheduling: what a step computes (`Chunk`), the KV work before it
(`KvPlan`), the scheduler's settings, and the exact-reuse rules they must satisfy.

Pure data and arithmetic; the server's config validation asks the same rules
(through engine/client.py), so a configuration it accepts is one the engine can run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.sequence import Sequence
from engine.slots import KvOp


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


# Repacked weights (llama.cpp's CPU "extra" buffers, used where the CPU has no AMX) multiply
# a step's activation rows four at a time and the rest one by one (ggml-cpu/repack.cpp:
# gemm over blocks of 4 rows, gemv for the remainder), and the two paths round apart. So
# a row's KV depends on whether its ubatch put it in a block of four: measured on Gemma 3
# 270M Q4_K_M on an AMD EPYC without flash attention, a prompt whose cold last chunk has 222
# rows (its last 2 in the remainder) differs from every warm start of a 64-row tail (max
# |dlogit| 1.1), and equals one of 66 rows. In exact mode a chunk therefore starts on a
# multiple of EXACT_ROW_BLOCK and only a prompt's last chunk may end off one: the
# remainder rows are then the same positions, the prompt's last `L mod 4`, cold or warm,
# and never reused (placement.reusable). Whole states cannot be cut to a block; they keep
# the plain rule.
EXACT_ROW_BLOCK = 4


# llama.cpp's CPU flash attention (ggml-cpu/ops.cpp, ggml_compute_forward_flash_attn_ext_f16)
# takes its tiled kernel (a small GEMM per tile) only for this many query rows of a KV
# stream in one ubatch (GGML_FA_TILE_Q); fewer go row by row. That is why 64 is the
# exact-reuse bound with flash attention, and why 63 rows over a 2k-token stream cost
# 1.6x what 64 do (bench/step_cost.py, docs/benchmarks.md "Where the rest of the time goes").
FLASH_TILE_ROWS = 64

# Where a warm start's few new rows are padded to that tile (SchedulerConfig.pad_from).
# On an AMD EPYC (2 cores, SmolLM2, flash attention on, 2 streams), one llama_decode of a
# warm chunk of R rows beside a decode row, against the 64-row tile in a decode of its own
# plus the decode row alone, in ms (bench/step_cost.py --tail):
#   stream of 1,024 cells: R=40 254, R=60 367, tile 282;   2,048: 396, 547, 409;
#   4,096: 578, 842, 537;   7,168: 919, 1,358, 985.
# The tile costs what 37-45 rows cost at every length: padding pays from about 48 rows.
PAD_FROM_ROWS = 48
# SchedulerConfig.cpu: which padding rule the load measured for its device.
CPU_TILE_PAYS = "tile pays"
CPU_ROW_BY_ROW = "row by row"
GPU_KERNELS = "gpu"


def exact_min_rows(flash_attn: bool) -> int:
    """The fewest rows of one sequence a step must compute to give exactly the KV and
    logits of one big step (see above): the one home of this rule."""
    return FLASH_TILE_ROWS if flash_attn else 2


def exact_min_chunk(min_rows: int) -> int:
    """The least prefill room per step that exact mode needs: a prompt of
    min_rows+1 .. 2*min_rows-1 pending tokens cannot be cut into two chunks of
    `min_rows`+ rows, so it must fit whole; and a chunk that does not end the prompt
    ends on a row block, which can take up to EXACT_ROW_BLOCK - 1 rows more room. With
    less room such a prompt would wait for ever (refused at construction instead)."""
    return 2 * min_rows + EXACT_ROW_BLOCK - 2


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
    checkpoint_tokens: int = 0  # those saves land on multiples of this (the cache's block)
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
        if self.exact or not self.flash_attn or self.cpu == GPU_KERNELS:
            return 0
        if not self.keeps_prefixes or self.whole_state or self.n_swa > 0:
            return 0
        return 1 if self.cpu == CPU_TILE_PAYS else PAD_FROM_ROWS

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
        """Chunks of this many rows get a llama_decode of their own (engine/runner.py);
        0: none. With a KV stream per slot, llama.cpp cuts a batch into ubatches holding
        the same number of rows of each sequence, so a chunk beside decode rows would lose
        rows to one-row ubatches: other kernels (exact reuse), and the slow path (a warm
        tail's tile, above)."""
        if self.pad_from:
            return FLASH_TILE_ROWS
        tail = self.tail_rows
        return tail if tail > 1 and self.keeps_prefixes else 0

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
