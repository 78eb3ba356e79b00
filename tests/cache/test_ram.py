"""The RAM tier's budget and its hit-weighted LRU order (cache/policy.py)."""

from __future__ import annotations

from cache.keys import entry_key, seed
from cache.policy import HIT_CAP, HIT_WEIGHT, UsagePolicy
from cache.ram import RamTier
from cache.types import Entry

SIZE = 100


def entry(name: int) -> Entry:
    tokens = (name,) * 4
    return Entry(entry_key(seed("ns", ""), tokens), "", tokens, bytes(SIZE - 16))


def test_entry_size_counts_state_tokens_and_salt() -> None:
    assert entry(1).nbytes == SIZE


def test_plain_lru_evicts_the_least_recently_used() -> None:
    ram = RamTier(3 * SIZE)
    a, b, c, d = (entry(i) for i in range(4))
    for e in (a, b, c):
        assert ram.put(e) == []
    assert ram.get(a.key) is a  # a is now more recent than b and c
    assert ram.put(d) == [b.key]
    assert [ram.contains(e.key) for e in (a, b, c, d)] == [True, False, True, True]
    assert ram.stats().entries == 3 and ram.stats().bytes == 3 * SIZE
    assert ram.stats().evictions == 1


def puts_survived(hits: int) -> int:
    """How many newer entries a first entry with `hits` hits outlives in a 3-entry tier."""
    ram = RamTier(3 * SIZE)
    first = entry(0)
    ram.put(first)
    for _ in range(hits):
        ram.get(first.key)
    for i in range(1, 1000):
        ram.put(entry(i))
        if not ram.contains(first.key):
            return i - 1
    raise AssertionError("never evicted")


def test_hits_buy_time_but_a_stale_hot_entry_ages_out() -> None:
    assert puts_survived(0) == 2  # plain LRU: the third newer put evicts it
    # Each hit is worth HIT_WEIGHT ticks of recency (a tie goes against the older use).
    assert puts_survived(3) == 2 + 3 * HIT_WEIGHT - 1
    assert puts_survived(HIT_CAP + 50) == puts_survived(HIT_CAP)


def test_hit_weight_is_capped() -> None:
    policy = UsagePolicy(budget=10)
    policy.add("many", 10)
    policy.add("some", 10)
    for _ in range(HIT_CAP * 10):
        policy.touch("many")
    for _ in range(HIT_CAP):
        policy.touch("some")
    # Both count HIT_CAP hits, so the less recent one goes despite ten times the hits.
    assert policy.victims() == ["many"]


def test_put_never_evicts_the_new_or_protected_entries() -> None:
    ram = RamTier(2 * SIZE)
    a, b, c = entry(1), entry(2), entry(3)
    ram.put(a)
    ram.put(b)
    assert ram.put(c, protect={a.key, b.key}) == []  # over budget for now
    assert ram.stats().bytes == 3 * SIZE
    assert ram.trim() == [a.key]  # once unprotected, the oldest goes
    assert not ram.fits(Entry("k", "", (1,), bytes(2 * SIZE)))
