"""What a cache tier offers, and how PrefixCache (cache/store.py) calls it.

PrefixCache keeps one ordered list of tiers (cache/tiers.py opens them), and a lookup
asks them in that order. Two class attributes say how a tier is reached:

`indexed`: the tier holds only what this cache put there, plus what it reports through
`take_lost` and `refresh` (another model's save evicting in a shared budget, another
process's files in a shared directory). PrefixCache's block index lists its entries and
reads them by key (`get`). Not indexed: other replicas write there too, so only the tier
can say what it holds: it is searched (`find`) for a longer prefix than the indexed tiers
offer. Indexed tiers come first in the list.

`blocking`: its reads and writes wait on I/O (files, a network). PrefixCache calls a
tier that is not blocking (a dict: RAM) only under its lock (its pool's lock:
cache/budget.py), and asks it directly where an entry is. A blocking tier guards itself
with a lock of its own, taken inside the cache's where both are held: PrefixCache never
holds its lock across that tier's get, find, clear, close, stats, take_lost, changed
or refresh, nor an indexed one's put; it may call the bookkeeping (fits, contains,
delete, touch, infos, problems) under it, and it records in the index which entries
such an indexed tier holds (copied from `contains` under the lock: cache/copies.py).
A tier that is not indexed takes `put` under the lock, so that a purge recorded after
the put covers it: its put only queues (a writer thread of its own), and it honours
purges itself (clear, purge_where).

A tier class names itself and subclasses `Tier`, which gives the defaults below (the
methods of the other kind raise TypeError: PrefixCache never calls them); its module's
`open_tier(context)` builds it from the configuration, or returns None when it is not
configured.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from cache.types import CacheConfig, Entry, EntryInfo, TierStats

if TYPE_CHECKING:
    from cache.budget import CacheBudget


class Tier(Protocol):
    name: str  # in stats, metrics, the status page and CacheHit.tier
    indexed: bool = True
    blocking: bool = False

    # -- every tier -------------------------------------------------------------------

    def fits(self, entry: Entry) -> bool:
        """Whether `entry` can be stored at all (its budget)."""
        ...

    def put(self, entry: Entry) -> list[str]:
        """Store `entry`; the keys of this tier evicted to stay in budget (never the
        entry itself, nor a pinned key). May raise OSError (a blocking tier's write)."""
        ...

    def clear(self) -> int:
        """Drop every entry of this namespace (a purge); how many."""
        ...

    def stats(self) -> TierStats:
        """Its contents and own counters (PrefixCache adds the lookups it counted)."""
        ...

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the saves it queued are stored; False on timeout."""
        return True

    def close(self, timeout: float | None = None) -> list[str]:
        """Store what it queued and let go of what it holds: the keys it no longer has."""
        return []

    # -- indexed tiers ----------------------------------------------------------------

    def get(self, key: str) -> Entry | None:
        """The entry, or None (absent, or unreadable: a blocking tier never raises)."""
        raise TypeError(f"the {self.name} tier is not indexed")

    def contains(self, key: str) -> bool:
        raise TypeError(f"the {self.name} tier is not indexed")

    def delete(self, key: str) -> bool:
        raise TypeError(f"the {self.name} tier is not indexed")

    def touch(self, key: str) -> None:
        """A hit: the entry is kept longer (it evicts by use)."""
        raise TypeError(f"the {self.name} tier is not indexed")

    def infos(self) -> Iterator[EntryInfo]:
        """What it holds (at start: what an earlier run left)."""
        raise TypeError(f"the {self.name} tier is not indexed")

    def take_lost(self) -> list[str]:
        """Keys other caches' saves evicted since the last call (a shared budget), for a
        tier that cannot report them at once (see `TierContext.on_evict`)."""
        return []

    def changed(self) -> bool:
        """Whether other processes may have changed it since the last refresh (cheap)."""
        return False

    def refresh(self) -> tuple[list[EntryInfo], list[str]]:
        """What other processes did to it: (entries new to it, keys gone)."""
        return [], []

    def pin(self, key: str | None) -> None:
        """Keep `key` from eviction until pinned to another key or None: its writes to
        the blocking tiers are in flight, and it must not be lost before."""
        return None

    def trim(self) -> list[str]:
        """Evict down to the budget (a pinned entry may have overrun it); the keys."""
        return []

    def problems(self) -> list[str]:
        """What is wrong with it (check_integrity), e.g. over budget."""
        return []

    # -- tiers that are not indexed ---------------------------------------------------

    def find(
        self,
        prompt: tuple[int, ...],
        hashes: Sequence[bytes],
        salt: str,
        longer_than: int,
        whole: bool,
    ) -> tuple[Entry, int] | None:
        """The stored entry of `salt` sharing more than `longer_than` tokens with
        `prompt` (its block hashes given), and how many; None otherwise. `whole`: only
        an entry that is a proper prefix of `prompt` (PrefixCache.whole_states)."""
        raise TypeError(f"the {self.name} tier is indexed: searched through the index")

    def purge_where(self, owns: Callable[[str], bool]) -> int:
        """Drop the entries whose salt `owns` accepts (an indexed tier's are deleted key
        by key, through the index); how many."""
        raise TypeError(f"the {self.name} tier is indexed: purged through the index")


@dataclass(frozen=True)
class TierContext:
    """What a tier is opened with. `on_evict(tier, key)`: another cache's save took the
    room of entry `key` of `tier` (a name); only for a tier whose budget is guarded by
    the cache's lock (the RAM pool's): it is called with that lock held."""

    config: CacheConfig
    namespace: str
    budget: CacheBudget
    on_evict: Callable[[str, str], None]


Opener = Callable[[TierContext], "Tier | None"]
