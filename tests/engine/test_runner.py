"""The runner's split of a step into llama_decode calls (exact reuse), without a model."""

from __future__ import annotations

from collections import Counter

from engine.llama import Batch
from engine.thread.plan import SchedulerConfig
from engine.thread.runner import Runner
from engine.thread.scheduler import Chunk
from tests.engine.test_scheduler import seq_of


class RecordingContext:
    """Stands in for engine.llama.Context: records each decode's rows per slot."""

    def __init__(self) -> None:
        self.decodes: list[dict[int, int]] = []

    def decode(self, batch: Batch) -> int:
        self.decodes.append(dict(Counter(int(s) for s in batch.seq_ids[: batch.size])))
        return 0


def run(solo_rows: int, lengths: list[int]) -> list[dict[int, int]]:
    """One step of one chunk per slot (slot i: `lengths[i]` rows); the decodes it made."""
    ctx = RecordingContext()
    chunks = []
    for slot, length in enumerate(lengths):
        seq = seq_of(f"s{slot}", list(range(1, 200)))
        seq.slot = slot
        chunks.append(Chunk(seq, 0, length, sample=False))
    Runner(ctx, 512, solo_rows=solo_rows).run(chunks)  # type: ignore[arg-type]
    return ctx.decodes


def test_without_exact_reuse_a_step_is_one_decode() -> None:
    assert run(0, [1, 2, 100]) == [{0: 1, 1: 2, 2: 100}]


def test_exact_chunks_run_alone_from_the_minimum_rows_on() -> None:
    # llama.cpp would cut a shared batch into ubatches of equal rows per sequence: the
    # 2-row chunk's first row would be computed as a one-row step beside slot 0's row.
    assert run(2, [1, 2, 5, 1]) == [{0: 1, 3: 1}, {1: 2}, {2: 5}]
    assert run(64, [1, 2, 64]) == [{0: 1, 1: 2}, {2: 64}]  # flash attention on


def test_only_exact_reuse_with_streams_per_slot_splits_a_step() -> None:
    def solo(**kw: object) -> int:
        return SchedulerConfig(4, 4 * 4096, 4096, 512, 256, **kw).solo_rows  # type: ignore[arg-type]

    assert solo(exact=False) == 0  # one decode a step
    assert solo(exact=True, exact_min_rows=2) == 2  # without flash attention
    assert solo(exact=True, exact_min_rows=64) == 64  # with it
    # a unified pool keeps no prefixes (and has no per-sequence ubatches): no split
    assert SchedulerConfig(4, 4096, 4096, 512, 256, exact=True).solo_rows == 0
