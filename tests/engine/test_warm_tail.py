"""The warm tail: how many prompt rows a warm start computes again, by configuration."""

from __future__ import annotations

import pytest

from engine.detokenizer import IncrementalDetokenizer
from engine.exact_rules import (
    CPU_ROW_BY_ROW,
    CPU_TILE_PAYS,
    GPU_KERNELS,
    PAD_FROM_ROWS,
    WINDOW_SOLO_ROWS,
)
from engine.sequence import Sequence
from engine.thread.placement import padded_keep, reuse_limit
from engine.thread.scheduler import Scheduler, SchedulerConfig
from engine.types import GenerateRequest


def config(**kw: object) -> SchedulerConfig:
    """Four slots with a KV stream each, flash attention on, a CPU where the tile pays
    (AMX), exact reuse off."""
    args: dict = dict(exact=False, flash_attn=True, cpu=CPU_TILE_PAYS) | kw
    return SchedulerConfig(4, 4 * 2000, 2000, 512, 256, **args)


def test_with_amx_every_short_warm_chunk_becomes_a_whole_tile() -> None:
    c = config()
    assert (c.warm_tail[0], c.pad_from, c.solo_rows) == (64, 1, 64)
    assert "with AMX" in c.warm_tail[1]
    assert reuse_limit(1000, c) == 999
    assert padded_keep(1000, 999, c) == 936  # the same prompt again: a tile
    assert padded_keep(1000, 950, c) == 936  # 50 new rows: a tile
    assert padded_keep(1000, 900, c) == 900  # 100 new rows: as they are
    assert padded_keep(1000, 0, c) == 0  # cold
    assert padded_keep(128, 127, c) == 64
    assert padded_keep(127, 126, c) == 126  # a short prompt keeps all but its last row


def test_without_amx_only_chunks_near_a_tile_are_padded() -> None:
    c = config(cpu=CPU_ROW_BY_ROW)
    assert (c.warm_tail[0], c.pad_from, c.solo_rows) == (64, PAD_FROM_ROWS, 64)
    assert "without AMX" in c.warm_tail[1] and f"{PAD_FROM_ROWS}-63 rows" in c.warm_tail[1]
    assert padded_keep(1000, 999, c) == 999  # one new row: computed alone
    assert padded_keep(1000, 1000 - (PAD_FROM_ROWS - 1), c) == 1000 - (PAD_FROM_ROWS - 1)
    assert padded_keep(1000, 1000 - PAD_FROM_ROWS, c) == 936
    assert padded_keep(1000, 937, c) == 936
    assert padded_keep(1000, 936, c) == 936
    assert padded_keep(100, 50, c) == 50  # under two tiles


@pytest.mark.parametrize(
    ("kw", "why"),
    [
        (dict(flash_attn=False), "flash attention off"),
        (dict(whole_state=True), "cut back"),
        (dict(n_swa=512), "cut back"),
        (dict(cpu=GPU_KERNELS), "GPU"),
    ],
)
def test_elsewhere_only_the_last_row_is_computed_again(kw: dict, why: str) -> None:
    c = config(**kw)
    assert (c.tail_rows, c.pad_from, c.warm_tail[0]) == (1, 0, 1)
    assert c.solo_rows == (WINDOW_SOLO_ROWS if "n_swa" in kw else 0)
    assert why in c.warm_tail[1]
    assert reuse_limit(1000, c) == 999
    assert padded_keep(1000, 950, c) == 950


def test_a_unified_pool_of_several_slots_computes_only_the_last_row() -> None:
    c = SchedulerConfig(4, 2000, 2000, 512, 256, exact=False, flash_attn=True, cpu=CPU_TILE_PAYS)
    assert (c.tail_rows, c.pad_from, c.solo_rows) == (1, 0, 0)


def test_exact_reuse_computes_its_measured_rows_whatever_the_prompt() -> None:
    c = config(exact=True, exact_min_rows=64)
    assert (c.tail_rows, c.pad_from, c.solo_rows) == (64, 0, 64)
    assert padded_keep(1000, 936, c) == 936
    assert reuse_limit(1000, c) == 936
    assert reuse_limit(100, c) == 36
    assert config(exact=True, exact_min_rows=2, flash_attn=False).solo_rows == 2


def test_the_same_long_prompt_again_starts_a_tile_back_in_its_own_chunk() -> None:
    s = Scheduler(config())
    prompt = tuple(range(1, 1001))
    first = Sequence(GenerateRequest("a", prompt), None, IncrementalDetokenizer([b""]), None)
    s.add(first)
    while first.num_computed < len(prompt):
        chunks, _ = s.schedule()
        for chunk in chunks:
            chunk.seq.num_computed += chunk.length
    first.tokens.append(7)
    s.remove(first)
    again = Sequence(GenerateRequest("b", prompt), None, IncrementalDetokenizer([b""]), None)
    s.add(again)
    chunks, _ = s.schedule()
    assert again.num_cached == 936
    assert [(c.start, c.length) for c in chunks] == [(936, 64)]
    s.check_integrity()


@pytest.mark.parametrize(("new_rows", "chunk"), [(10, (1000, 10)), (50, (986, 64))])
def test_without_amx_a_grown_prompt_pads_only_near_a_tile(
    new_rows: int, chunk: tuple[int, int]
) -> None:
    s = Scheduler(config(cpu=CPU_ROW_BY_ROW))
    prompt = tuple(range(1, 1001))
    first = Sequence(GenerateRequest("a", prompt), None, IncrementalDetokenizer([b""]), None)
    s.add(first)
    while first.num_computed < len(prompt):
        for c in s.schedule()[0]:
            c.seq.num_computed += c.length
    s.remove(first)
    grown = prompt + tuple(range(2000, 2000 + new_rows))
    again = Sequence(GenerateRequest("b", grown), None, IncrementalDetokenizer([b""]), None)
    s.add(again)
    chunks, _ = s.schedule()
    assert [(c.start, c.length) for c in chunks] == [chunk]
    s.check_integrity()


def test_a_window_model_prefills_long_chunks_in_decodes_of_their_own() -> None:
    """On a CPU with flash attention only: a chunk beside another slot's decode row was
    measured slower than the two apart from 128 rows on (engine/exact_rules.py)."""
    assert config(n_swa=512).solo_rows == WINDOW_SOLO_ROWS
    assert config(n_swa=512, cpu=CPU_ROW_BY_ROW).solo_rows == WINDOW_SOLO_ROWS
    assert config(n_swa=512, exact=True, exact_min_rows=64).solo_rows == 64  # its own rows
    assert config(n_swa=512, cpu=GPU_KERNELS).solo_rows == 0
    assert config(n_swa=512, flash_attn=False).solo_rows == 0
    assert config(n_swa=512, whole_state=True).solo_rows == 0  # hybrid: not measured
    unified = SchedulerConfig(4, 2000, 2000, 512, 256, exact=False, flash_attn=True, n_swa=512)
    assert unified.solo_rows == 0  # one pool: no ubatches per sequence
