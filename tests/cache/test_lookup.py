"""Longest-prefix lookups, isolation and deduplication (RAM tier only)."""

from __future__ import annotations

import pytest

from cache import CacheConfig, PrefixCache
from tests.cache.conftest import MakeCache
from tests.cache.util import BLOCK, saved, state_for

TEN = list(range(10))  # two full blocks of 4 and a tail of 2


@pytest.fixture
def cache(make_cache: MakeCache) -> PrefixCache:
    return make_cache(disk_dir="")


def test_exact_hit(cache: PrefixCache) -> None:
    saved(cache, TEN)
    hit = cache.lookup(TEN)
    assert hit is not None
    assert (hit.tokens, hit.num_matched, hit.tier) == (tuple(TEN), 10, "ram")
    assert hit.state == state_for(TEN)


def test_partial_hit_stops_at_the_first_difference(cache: PrefixCache) -> None:
    saved(cache, TEN)
    hit = cache.lookup([0, 1, 2, 3, 4, 5, 99, 7, 8, 9, 10])
    assert hit is not None and hit.num_matched == 6 and hit.tokens == tuple(TEN)


def test_hit_extends_into_the_entry_tail(cache: PrefixCache) -> None:
    saved(cache, TEN)
    hit = cache.lookup([*range(9), 99])  # two full blocks, then one more common token
    assert hit is not None and hit.num_matched == 9
    longer = cache.lookup([*TEN, 10, 11, 12])  # the prompt goes on past the entry
    assert longer is not None and longer.num_matched == 10


def test_prompt_inside_an_entry_is_an_exact_hit(cache: PrefixCache) -> None:
    saved(cache, TEN)
    hit = cache.lookup(TEN[:6])
    assert hit is not None and hit.num_matched == 6 and hit.tokens == tuple(TEN)


def test_short_prompts_and_unknown_heads_miss(cache: PrefixCache) -> None:
    saved(cache, TEN)
    assert cache.lookup(TEN[: BLOCK - 1]) is None  # shorter than a block
    assert cache.lookup([0, 1, 2, 99, 4, 5, 6, 7]) is None  # differs in block 1
    assert cache.lookup([]) is None
    stats = cache.stats()
    assert (stats.ram.hits, stats.ram.misses) == (0, 3)


def test_best_of_several_entries_sharing_a_boundary(cache: PrefixCache) -> None:
    saved(cache, [*range(8), 20, 21], [*range(8), 30, 31, 32], [*range(8), 30, 40])
    hit = cache.lookup([*range(8), 30, 31, 77])
    assert hit is not None and hit.num_matched == 10
    assert hit.tokens == (*range(8), 30, 31, 32)
    assert hit.state == state_for(hit.tokens)


def test_entries_shorter_than_min_tokens_are_not_stored(make_cache: MakeCache) -> None:
    cache = make_cache(disk_dir="", min_tokens=8)
    assert not cache.save(TEN[:7], state_for(TEN[:7]))
    assert cache.save(TEN[:8], state_for(TEN[:8]))
    assert cache.flush(timeout=30)
    assert cache.stats().saves == 1 and cache.stats().saves_dropped == 0


def test_salt_isolates_tenants(cache: PrefixCache) -> None:
    saved(cache, TEN, salt="tenant-a")
    assert cache.lookup(TEN) is None
    assert cache.lookup(TEN, salt="tenant-b") is None
    hit = cache.lookup(TEN, salt="tenant-a")
    assert hit is not None and hit.num_matched == 10
    saved(cache, TEN, salt="tenant-b")  # the same tokens under another salt: its own entry
    assert cache.stats().ram.entries == 2


def test_namespaces_do_not_share_entries(make_cache: MakeCache) -> None:
    first, second = make_cache("model-a"), make_cache("model-b")  # one disk_dir
    saved(first, TEN)
    assert second.lookup(TEN) is None
    restarted = make_cache("model-b")
    assert restarted.lookup(TEN) is None and restarted.stats().disk.entries == 0
    assert make_cache("model-a").lookup(TEN) is not None


def test_saving_a_covered_prefix_is_skipped(cache: PrefixCache) -> None:
    saved(cache, TEN)
    assert cache.save(TEN[:8], state_for(TEN[:8]))  # covered: nothing to do
    assert cache.save(TEN, state_for(TEN))  # the same tokens again
    assert cache.flush(timeout=30)
    stats = cache.stats()
    assert (stats.saves, stats.saves_skipped, stats.ram.entries) == (1, 2, 1)


def test_an_extension_replaces_its_prefix(make_cache: MakeCache) -> None:
    cache = make_cache()
    saved(cache, TEN[:8])
    saved(cache, TEN, [*TEN, 10, 11, 12])  # a conversation growing turn by turn
    stats = cache.stats()
    assert (stats.saves, stats.ram.entries, stats.disk.entries) == (3, 1, 1)
    hit = cache.lookup(TEN[:8])
    assert hit is not None and hit.tokens == (*TEN, 10, 11, 12)
    # A divergent continuation is a new entry beside the first, not a replacement.
    saved(cache, [*TEN[:8], 50, 51])
    assert cache.stats().ram.entries == 2


def test_disabled_cache_stores_nothing(tmp_path: object) -> None:
    cache = PrefixCache(CacheConfig(enabled=False, disk_dir=str(tmp_path)), "ns")
    assert not cache.save(list(range(200)), b"x")
    assert cache.lookup(list(range(200))) is None
    assert cache.flush(timeout=1) and cache.purge() == 0
    cache.close()


def test_purge_drops_everything(make_cache: MakeCache) -> None:
    cache = make_cache()
    saved(cache, TEN, [5, 6, 7, 8, 9])
    assert cache.purge() == 2
    assert cache.lookup(TEN) is None
    stats = cache.stats()
    assert (stats.ram.entries, stats.disk.entries, stats.disk.bytes) == (0, 0, 0)
    assert make_cache().stats().disk.entries == 0  # the files are gone too


@pytest.mark.parametrize("bad", ["", "..", "a/b", "x y"])
def test_namespace_must_be_a_plain_name(bad: str) -> None:
    with pytest.raises(ValueError, match="namespace"):
        PrefixCache(CacheConfig(disk_dir=""), bad)


@pytest.mark.parametrize("field", ["block_tokens", "writer_queue", "ram_bytes", "min_tokens"])
def test_config_rejects_out_of_range_values(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        CacheConfig(**{field: -1})  # type: ignore[arg-type]


def test_ram_budget_evicts_the_least_used_entry(make_cache: MakeCache) -> None:
    a, b, c, d = ([i] * 8 for i in range(4))
    cache = make_cache(disk_dir="", ram_bytes=3 * (100 + 4 * 8))
    saved(cache, a, b, c)
    assert cache.lookup(a) is not None  # a is used again: b is now the least used
    saved(cache, d)
    assert cache.lookup(b) is None
    assert all(cache.lookup(t) is not None for t in (a, c, d))
    stats = cache.stats()
    assert (stats.ram.entries, stats.ram.evictions, stats.ram.bytes) == (3, 1, 3 * 132)
