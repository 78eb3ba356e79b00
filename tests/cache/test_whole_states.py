"""Whole states (recurrent and hybrid models, engine/family.py): a stored state is valid
for exactly its tokens, so an entry serves only prompts it is a proper prefix of, and
prefixes are kept beside their extensions (each is a checkpoint)."""

from __future__ import annotations

from cache import PrefixCache
from tests.cache.conftest import MakeCache
from tests.cache.util import saved

TEN = list(range(100, 110))


def whole(make_cache: MakeCache, **overrides: object) -> PrefixCache:
    cache = make_cache(**overrides)
    cache.whole_states = True
    return cache


def test_an_entry_serves_only_prompts_it_is_a_proper_prefix_of(make_cache: MakeCache) -> None:
    cache = whole(make_cache)
    saved(cache, TEN)
    assert cache.lookup(TEN[:8]) is None  # inside the entry: its state holds more tokens
    assert cache.lookup(TEN) is None  # the very tokens: nothing left to compute
    assert cache.lookup([*TEN[:8], 50, 51, 52]) is None  # diverges inside it
    hit = cache.lookup([*TEN, 1, 2])
    assert hit is not None and hit.tokens == tuple(TEN) and hit.num_matched == 10


def test_the_longest_proper_prefix_wins_and_prefixes_stay(make_cache: MakeCache) -> None:
    cache = whole(make_cache)
    saved(cache, TEN[:4], TEN[:8], TEN)  # checkpoints of one growing prompt
    stats = cache.stats()
    assert (stats.saves, stats.ram.entries) == (3, 3)  # none replaced its prefixes
    for prompt, expected in (([*TEN, 7], 10), (TEN, 8), ([*TEN[:8], 9, 9], 8), (TEN[:5], 4)):
        hit = cache.lookup(prompt)
        assert hit is not None and hit.num_matched == expected == len(hit.tokens), prompt


def test_a_longer_entry_does_not_make_a_prefix_save_redundant(make_cache: MakeCache) -> None:
    cache = whole(make_cache)
    saved(cache, TEN)
    assert cache.save(TEN[:8], b"s" * 100)  # stored: the longer state cannot serve it
    assert cache.save(TEN, b"t" * 100)  # the same tokens again: skipped
    assert cache.flush(timeout=30)
    stats = cache.stats()
    assert (stats.saves, stats.saves_skipped, stats.ram.entries) == (2, 1, 2)


def test_whole_state_lookups_read_the_disk_tier_too(make_cache: MakeCache) -> None:
    cache = whole(make_cache, ram_bytes=150)  # room for one entry in RAM
    saved(cache, TEN[:8], TEN)
    hit = cache.lookup([*TEN[:8], 0, 0])  # TEN[:8] was pushed out of RAM to disk
    assert hit is not None and hit.tier == "disk" and hit.tokens == tuple(TEN[:8])
    cache.check_integrity()
