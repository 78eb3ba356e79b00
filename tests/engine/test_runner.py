"""The runner's split of a step into llama_decode calls (exact reuse, flash attention's
tiled kernel), without a model; and which configurations ask for it."""

from __future__ import annotations

from collections import Counter

from engine.llama import Batch
from engine.plan import FLASH_TILE_ROWS, SchedulerConfig
from engine.runner import Runner
from engine.scheduler import Chunk
from tests.engine.test_scheduler import seq_of


class RecordingContext:
    """Stands in for engine.llama.Context: records each decode's rows per slot."""

    def __init__(self) -> None:
        self.decodes: list[dict[int, int]] = []

    def decode(self, batch: Batch) -> int:
        self.decodes.append(dict(Counter(int(s) for s in batch.seq_ids[: batch.size])))
        return 0


def run(solo_rows: int, lengths: list[int], apart: bool = True) -> list[dict[int, int]]:
    """One step of one chunk per slot (slot i: `lengths[i]` rows); the decodes it made."""
    ctx = RecordingContext()
    chunks = []
    for slot, length in enumerate(lengths):
        seq = seq_of(f"s{slot}", list(range(1, 200)))
        seq.slot = slot
        chunks.append(Chunk(seq, 0, length, sample=False))
    Runner(ctx, 512, solo_rows=solo_rows, apart=apart).run(chunks)  # type: ignore[arg-type]
    return ctx.decodes


def test_without_exact_reuse_a_step_is_one_decode() -> None:
    assert run(0, [1, 2, 100]) == [{0: 1, 1: 2, 2: 100}]


def test_exact_chunks_run_alone_from_the_minimum_rows_on() -> None:
    # llama.cpp would cut a shared batch into ubatches of equal rows per sequence: the
    # 2-row chunk's first row would be computed as a one-row step beside slot 0's row.
    assert run(2, [1, 2, 5, 1]) == [{0: 1, 3: 1}, {1: 2}, {2: 5}]
    assert run(64, [1, 2, 64]) == [{0: 1, 1: 2}, {2: 64}]  # flash attention on


def test_flash_attention_chunks_leave_the_decode_rows_together() -> None:
    # without exact reuse the long chunks share one decode (one pass over the weights
    # for a burst of prompts), apart from the decode rows that would cut them to 63
    assert run(64, [1, 70, 64, 3], apart=False) == [{0: 1, 3: 3}, {1: 70, 2: 64}]
    assert run(64, [1, 2], apart=False) == [{0: 1, 1: 2}]  # no long chunk: one decode


def test_solo_rows_follow_exact_reuse_and_flash_attention() -> None:
    def solo(**kw: object) -> int:
        config = {"exact": False, "exact_min_rows": 64, **kw}
        return SchedulerConfig(4, 4 * 4096, 4096, 512, 256, **config).solo_rows  # type: ignore[arg-type]

    assert solo() == 0  # no flash attention, no exact reuse: one decode a step
    # flash attention on the CPU with a stream per slot: 64+ rows keep the tiled kernel
    assert solo(flash_tiles=True) == FLASH_TILE_ROWS == 64
    assert solo(exact=True, exact_min_rows=2) == 2  # exact reuse without flash attention
    assert solo(exact=True, exact_min_rows=64, flash_tiles=True) == 64
    config = SchedulerConfig(4, 4 * 4096, 4096, 512, 256, exact=False, flash_tiles=True)
    assert not config.solo_apart  # flash attention alone: long chunks in one decode
    assert SchedulerConfig(4, 4 * 4096, 4096, 512, 256, exact=True).solo_apart
