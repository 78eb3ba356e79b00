"""One RAM and one disk budget for several models' caches (issue 28, item 9): each
model's cache used to size its tiers on its own, so N models took N budgets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import cache.record as record
from cache import CacheBudget, PrefixCache
from cache.budget import Pool
from cache.ram import RamTier
from cache.types import Entry
from tests.cache.util import config, saved, state_for

ENTRY = 100 + 4 * 8  # a state of 100 bytes for 8 tokens (Entry.nbytes)


def prompts(first: int, count: int) -> list[list[int]]:
    return [list(range(first + 100 * i, first + 100 * i + 8)) for i in range(count)]


@pytest.fixture
def caches(tmp_path: Path) -> Iterator[list[PrefixCache]]:
    made: list[PrefixCache] = []
    yield made
    for cache in made:
        cache.close(timeout=30)


def test_two_models_stay_within_one_ram_budget(caches: list[PrefixCache]) -> None:
    budget = CacheBudget(ram_bytes=4 * ENTRY, disk_bytes=0)
    cfg = config(disk_dir="")
    a, b = PrefixCache(cfg, "model-a", budget), PrefixCache(cfg, "model-b", budget)
    caches += [a, b]
    for tokens in prompts(0, 4):
        saved(a, tokens)
    assert budget.ram.total_bytes == 4 * ENTRY  # the budget is full with a's alone
    for n, tokens in enumerate(prompts(10_000, 3), 1):
        saved(b, tokens)
        assert budget.ram.total_bytes <= 4 * ENTRY
        assert a.stats().ram.entries == 4 - n  # b's saves evicted a's oldest
    assert b.stats().ram.entries == 3 and a.stats().ram.evictions == 3
    for cache in (a, b):
        cache.check_integrity()
    assert a.lookup(prompts(0, 1)[0]) is None  # the oldest of a's: gone from its index
    assert a.lookup(prompts(0, 4)[3]) is not None
    # A closed cache (its model deleted) gives its RAM back: b may use all of it.
    a.close()
    assert budget.ram.total_bytes == 3 * ENTRY
    saved(b, prompts(20_000, 1)[0])
    assert b.stats().ram.entries == 4 and budget.ram.total_bytes == 4 * ENTRY


def test_a_hot_entry_of_one_model_outlives_another_models_one_off_saves(
    caches: list[PrefixCache],
) -> None:
    budget = CacheBudget(ram_bytes=3 * ENTRY, disk_bytes=0)
    cfg = config(disk_dir="")
    a, b = PrefixCache(cfg, "model-a", budget), PrefixCache(cfg, "model-b", budget)
    caches += [a, b]
    hot = prompts(0, 1)[0]
    saved(a, hot)
    for _ in range(4):
        assert a.lookup(hot) is not None  # a shared system prompt, used often
    for tokens in prompts(10_000, 4):
        saved(b, tokens)
    assert a.lookup(hot) is not None and budget.ram.total_bytes <= 3 * ENTRY


def test_two_models_stay_within_one_disk_budget(
    tmp_path: Path, caches: list[PrefixCache]
) -> None:
    size = record.encoded_size("model-a", "", 8, 4 * ENTRY)  # an entry's file
    budget = CacheBudget(ram_bytes=0, disk_bytes=3 * size)
    cfg = config(disk_dir=str(tmp_path / "kv"), ram_bytes=0)
    a, b = PrefixCache(cfg, "model-a", budget), PrefixCache(cfg, "model-b", budget)
    caches += [a, b]
    for tokens in prompts(0, 3):
        saved(a, tokens, size=4 * ENTRY)
    assert a.stats().disk.entries == 3
    saved(b, prompts(10_000, 1)[0], size=4 * ENTRY)
    assert budget.disk.total_bytes <= 3 * size
    files = sorted(p.parent.name for p in (tmp_path / "kv").rglob("*.kv"))
    assert files == ["model-a", "model-a", "model-b"]  # one of a's files was deleted
    assert a.stats().disk.entries == 2 and a.stats().disk.evictions == 1
    assert a.lookup(prompts(0, 1)[0]) is None  # its oldest, a miss (never an error)
    for cache in (a, b):
        cache.check_integrity()
    # A restart counts every model's files against the one budget again.
    again = CacheBudget(ram_bytes=0, disk_bytes=3 * size)
    caches += [PrefixCache(cfg, "model-a", again), PrefixCache(cfg, "model-b", again)]
    assert again.disk.total_bytes == budget.disk.total_bytes


def test_a_pinned_entry_is_evicted_by_no_tier() -> None:
    pool = Pool(2 * ENTRY)
    one, two = RamTier(pool), RamTier(pool)
    tokens = prompts(0, 3)
    entries = [Entry(f"k{i}", "", tuple(t), state_for(t)) for i, t in enumerate(tokens)]
    one.put(entries[0])
    one.pin("k0")  # its disk write is in flight
    two.put(entries[1])
    assert two.put(entries[2]) == ["k1"]  # two gives up its own older entry, not k0
    assert one.contains("k0") and pool.total_bytes == 2 * ENTRY
    one.pin(None)
    two.get("k2")
    assert two.put(entries[1]) == [] and not one.contains("k0")  # k0 was the oldest
