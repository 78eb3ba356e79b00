"""The tiers as a list: a tier plugged in with one more opener (cache/tiers.py's line)
is written through, asked in its turn and promoted from, with store.py untouched."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import cache.record as record
from cache import PrefixCache
from cache.keys import entry_key, seed
from cache.tier import Tier, TierContext
from cache.tiers import TIERS
from cache.types import Entry, EntryInfo, TierStats
from tests.cache.util import config, saved, state_for
from tests.helpers.redis_process import running_redis

A, B = [1] * 8, [2] * 8
PROMPT = [7, 7, 7, 7, 1, 2, 3, 4, 5, 6, 7, 8, 9]  # three full blocks of 4, and one token
ASK = [*PROMPT, 10, 11, 12]


class _DictTier(Tier):
    """Entries in a dict behind a lock of its own, as a blocking tier guards itself."""

    blocking = True

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        self.lock = threading.Lock()

    def fits(self, entry: Entry) -> bool:
        return True

    def put(self, entry: Entry) -> list[str]:
        with self.lock:
            self.entries[entry.key] = entry
        return []

    def clear(self) -> int:
        with self.lock:
            count = len(self.entries)
            self.entries.clear()
            return count

    def stats(self) -> TierStats:
        with self.lock:
            return TierStats(entries=len(self.entries))


class ColdTier(_DictTier):
    """An indexed tier: this process alone writes it (an object store, say)."""

    name = "cold"

    def get(self, key: str) -> Entry | None:
        with self.lock:
            return self.entries.get(key)

    def contains(self, key: str) -> bool:
        with self.lock:
            return key in self.entries

    def delete(self, key: str) -> bool:
        with self.lock:
            return self.entries.pop(key, None) is not None

    def touch(self, key: str) -> None:
        pass

    def infos(self) -> Iterator[EntryInfo]:
        with self.lock:
            return iter([entry.info for entry in self.entries.values()])


class ArchiveTier(_DictTier):
    """A tier others write too: searched, not indexed."""

    name = "archive"
    indexed = False

    def find(
        self, prompt: tuple[int, ...], hashes: object, salt: str, longer_than: int, whole: bool
    ) -> tuple[Entry, int] | None:
        with self.lock:
            found = [
                (e, _common(e.tokens, prompt)) for e in self.entries.values() if e.salt == salt
            ]
        found = [(e, n) for e, n in found if n > longer_than and (not whole or n == len(e.tokens))]
        return max(found, key=lambda item: item[1], default=None)

    def purge_where(self, owns: Callable[[str], bool]) -> int:
        with self.lock:
            gone = [key for key, entry in self.entries.items() if owns(entry.salt)]
            for key in gone:
                del self.entries[key]
            return len(gone)


def _common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def plugged(tier: Tier) -> tuple[Callable[[TierContext], Tier | None], ...]:
    """cache/tiers.py's list with one more line."""
    return (*TIERS, lambda context: tier)


def test_a_fourth_tier_behind_the_shared_one_is_asked_and_promoted_from(tmp_path: Path) -> None:
    archive = ArchiveTier()
    with running_redis(tmp_path) as store:
        cfg = config(disk_dir=str(tmp_path / "kv"), shared_url=store.url)
        cache = PrefixCache(cfg, "ns", tiers=plugged(archive))
        try:
            saved(cache, PROMPT)
            assert [e.tokens for e in archive.entries.values()] == [
                tuple(PROMPT)
            ]  # written through
            cache.purge()  # every tier: the archive too
            assert archive.entries == {}
            key = entry_key(seed("ns", ""), tuple(PROMPT))
            entry = Entry(key, "", tuple(PROMPT), state_for(PROMPT))
            archive.put(entry)  # as another replica would

            hit = cache.lookup(ASK)  # ram, disk and shared miss: the archive has it
            assert hit is not None and hit.tier == "archive" and hit.state == entry.state
            assert hit.num_matched == len(PROMPT)
            again = cache.lookup(ASK)
            assert again is not None and again.tier == "ram"  # promoted
            tiers = cache.stats().tiers
            assert list(tiers) == ["ram", "disk", "shared", "archive"]
            assert (tiers["ram"].hits, tiers["ram"].misses) == (1, 1)
            assert (tiers["disk"].misses, tiers["shared"].misses) == (1, 2)
            assert (tiers["archive"].hits, tiers["archive"].misses) == (1, 1)
            cache.check_integrity()
        finally:
            cache.close(timeout=30)


def test_an_indexed_tier_behind_disk_is_written_through_and_promoted_from(
    tmp_path: Path,
) -> None:
    cold = ColdTier()
    file = record.encoded_size("ns", "", 8, 100)
    cfg = config(disk_dir=str(tmp_path / "kv"), ram_bytes=100 + 4 * 8, disk_bytes=file)
    cache = PrefixCache(cfg, "ns", tiers=plugged(cold))  # RAM and disk: one entry each
    try:
        saved(cache, A)
        saved(cache, B)  # A leaves RAM and disk, and stays in the cold tier
        assert len(cold.entries) == 2 and cache.stats().disk.entries == 1
        hit = cache.lookup(A)
        assert hit is not None and hit.tier == "cold" and hit.state == state_for(A)
        again = cache.lookup(A)
        assert again is not None and again.tier == "ram"  # promoted
        stats = cache.stats().tiers
        assert (stats["ram"].hits, stats["ram"].misses) == (1, 1)
        assert (stats["disk"].hits, stats["disk"].misses) == (0, 1)
        assert (stats["cold"].hits, stats["cold"].misses, stats["cold"].entries) == (1, 0, 2)
        cache.check_integrity()
        assert cache.purge() == 2 and cold.entries == {}
    finally:
        cache.close(timeout=30)


def test_a_restarted_cache_indexes_what_a_plugged_tier_holds(tmp_path: Path) -> None:
    cold = ColdTier()
    first = PrefixCache(config(), "ns", tiers=plugged(cold))
    saved(first, A)
    first.close(timeout=30)  # its RAM is gone; the cold tier keeps A
    again = PrefixCache(config(), "ns", tiers=plugged(cold))
    try:
        hit = again.lookup(A)
        assert hit is not None and hit.tier == "cold"
        again.check_integrity()
    finally:
        again.close(timeout=30)


def test_the_indexed_tiers_come_first() -> None:
    with pytest.raises(ValueError, match="indexed ones come first"):
        PrefixCache(config(), "ns", tiers=(lambda c: ArchiveTier(), *TIERS))
