"""The RAM tier: whole entries in a dict under a byte budget, hit-weighted LRU eviction.

The first tier (cache/tier.py: indexed, not blocking). The budget may be the process's
(a `Pool` of cache/budget.py that every model's RAM tier counts into): then a put here
may evict another model's entry, through that tier's `_evicted`. Not thread-safe on its
own: PrefixCache calls it only under its lock, which is the pool's lock (every call is a
dict operation; no I/O).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator

from cache.budget import Pool
from cache.tier import Tier, TierContext
from cache.types import Entry, EntryInfo, TierStats


class RamTier(Tier):
    name = "ram"
    indexed = True
    blocking = False

    def __init__(self, budget: int | Pool, on_evict: Callable[[str], None] | None = None) -> None:
        """`on_evict(key)`: another tier of the pool took the room of entry `key`."""
        self._entries: dict[str, Entry] = {}
        self._pool = budget if isinstance(budget, Pool) else Pool(budget)
        self._policy = self._pool.share(self._evicted)
        self._on_evict = on_evict
        self._evictions = 0
        self._released = False

    def get(self, key: str) -> Entry | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._policy.touch(key)
        return entry

    def fits(self, entry: Entry) -> bool:
        return not self._released and self._policy.fits(entry.nbytes)

    def put(self, entry: Entry, protect: Collection[str] = ()) -> list[str]:
        """Store `entry` (the caller checked fits()) and evict others to stay in budget.
        Returns the keys of this tier evicted (other tiers' hear through their hook)."""
        self._entries[entry.key] = entry
        self._policy.add(entry.key, entry.nbytes)
        return self.trim(protect={entry.key, *protect})

    def trim(self, protect: Collection[str] = ()) -> list[str]:
        """Evict the lowest-scored unprotected entries until the budget is kept."""
        victims = self._policy.victims(protect)
        for key in victims:
            self.delete(key)
        self._evictions += len(victims)
        return victims

    def pin(self, key: str | None) -> None:
        """Keep `key` (a save whose disk write is in flight) from any eviction, by any
        tier of the pool, until pinned to another key or None."""
        self._policy.pinned = {key} if key is not None else set()

    def _evicted(self, key: str) -> None:
        if self._entries.pop(key, None) is not None:
            self._evictions += 1
            if self._on_evict is not None:
                self._on_evict(key)

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

    def close(self, timeout: float | None = None) -> list[str]:
        """Give every byte back to the pool and take no more (the cache is closed);
        the keys that were held."""
        keys = list(self._entries)
        self.clear()
        self.pin(None)
        self._released = True
        self._pool.leave(self._policy)
        return keys

    def infos(self) -> Iterator[EntryInfo]:
        return (entry.info for entry in list(self._entries.values()))

    def problems(self) -> list[str]:
        over = self._pool.total_bytes > self._pool.budget
        return ["the RAM tier is over budget"] if over else []

    def stats(self) -> TierStats:
        return TierStats(
            entries=len(self._entries),
            bytes=self._policy.total_bytes,
            evictions=self._evictions,
        )


def open_tier(context: TierContext) -> RamTier:
    """Every cache has one (a budget of 0 stores nothing), in the process's RAM pool."""
    return RamTier(context.budget.ram, on_evict=lambda key: context.on_evict(RamTier.name, key))
