"""The warm tail: how many prompt rows a warm start computes again, by configuration."""

from __future__ import annotations

import pytest

from engine.detokenizer import IncrementalDetokenizer
from engine.placement import reuse_limit
from engine.scheduler import Scheduler, SchedulerConfig
from engine.sequence import Sequence
from engine.types import GenerateRequest


def config(**kw: object) -> SchedulerConfig:
    """Four slots with a KV stream each, flash attention on, a CPU where the tile pays
    (AMX), exact reuse off."""
    args: dict = dict(exact=False, flash_attn=True, tile_pays=True) | kw
    return SchedulerConfig(4, 4 * 2000, 2000, 512, 256, **args)


def test_flash_attention_with_a_stream_per_slot_computes_a_whole_tile() -> None:
    c = config()
    assert (c.tail_rows, c.solo_rows) == (64, 64)
    assert "with AMX" in c.warm_tail[1]
    assert reuse_limit(1000, c) == 936
    assert reuse_limit(128, c) == 64
    assert reuse_limit(127, c) == 126  # a short prompt keeps all but its last row


@pytest.mark.parametrize(
    ("kw", "why"),
    [
        (dict(flash_attn=False), "flash attention off"),
        (dict(whole_state=True), "cut back"),
        (dict(n_swa=512), "cut back"),
        (dict(tile_pays=False), "without AMX"),
    ],
)
def test_elsewhere_only_the_last_row_is_computed_again(kw: dict, why: str) -> None:
    c = config(**kw)
    assert (c.tail_rows, c.solo_rows) == (1, 0)
    assert why in c.warm_tail[1]
    assert reuse_limit(1000, c) == 999


def test_a_unified_pool_of_several_slots_computes_only_the_last_row() -> None:
    c = SchedulerConfig(4, 2000, 2000, 512, 256, exact=False, flash_attn=True, tile_pays=True)
    assert (c.tail_rows, c.solo_rows) == (1, 0)


def test_exact_reuse_computes_its_measured_rows_whatever_the_prompt() -> None:
    c = config(exact=True, exact_min_rows=64)
    assert (c.tail_rows, c.solo_rows) == (64, 64)
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
