"""The RAM tier: whole entries in a dict under a byte budget, hit-weighted LRU eviction.

Not thread-safe on its own: PrefixCache calls it only under its lock (every call is a
dict operation; no I/O).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator

from cache.policy import UsagePolicy
from cache.types import Entry, EntryInfo, TierStats


class RamTier:
    name = "ram"

    def __init__(self, budget: int) -> None:
        self._entries: dict[str, Entry] = {}
        self._policy = UsagePolicy(budget)
        self._evictions = 0

    def get(self, key: str) -> Entry | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._policy.touch(key)
        return entry

    def fits(self, entry: Entry) -> bool:
        return self._policy.fits(entry.nbytes)

    def put(self, entry: Entry, protect: Collection[str] = ()) -> list[str]:
        """Store `entry` (the caller checked fits()) and evict others to stay in budget."""
        self._entries[entry.key] = entry
        self._policy.add(entry.key, entry.nbytes)
        return self.trim(protect={entry.key, *protect})

    def trim(self, protect: Collection[str] = ()) -> list[str]:
        """Evict the lowest-scored unprotected entries until the tier is in budget."""
        victims = self._policy.victims(protect)
        for key in victims:
            self.delete(key)
        self._evictions += len(victims)
        return victims

    def contains(self, key: str) -> bool:
        return key in self._entries

    def delete(self, key: str) -> bool:
        self._policy.remove(key)
        return self._entries.pop(key, None) is not None

    def touch(self, key: str) -> None:
        self._policy.touch(key)

    def clear(self) -> int:
        count = len(self._entries)
        for key in list(self._entries):
            self.delete(key)
        return count

    def infos(self) -> Iterator[EntryInfo]:
        return (entry.info for entry in list(self._entries.values()))

    def stats(self) -> TierStats:
        return TierStats(
            entries=len(self._entries),
            bytes=self._policy.total_bytes,
            evictions=self._evictions,
        )
