"""One RAM budget and one disk budget for every prefix cache of a process.

A server opens one PrefixCache per model (per namespace: file and KV layout). Each used
to size its tiers on its own, so budgets multiplied with the models served: N models,
N x `ram_bytes` of RAM and N x `disk_bytes` of disk, and a pulled model added one more
of each. A `CacheBudget` is made once and handed to every cache of the process: each
tier (a model's RAM tier, a model's disk tier) keeps its entries, but their bytes are
counted in one `Pool` per kind, whose one `UsagePolicy` picks the least valuable entry
whichever model's it is. An idle model's entries age out as the others' are used; a
closed cache (its model deleted) gives its RAM back at once.

Threads: a pool is guarded by its `lock`, which is the lock of every tier it counts:
the RAM pool's is the one lock of every PrefixCache made with the budget (the RAM tier
is only touched under it), the disk pool's the one lock of every DiskTier. So a tier
that needs room may evict another tier's entry at once: its `evict` hook runs under the
lock already held. The hooks only drop bookkeeping (and a file); they never take
another lock, so the order stays PrefixCache lock -> disk lock.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Collection

from cache.policy import UsagePolicy
from cache.types import CacheConfig

_ids = itertools.count()


class Pool:
    """One byte budget over the entries of several tiers (callers hold `lock`)."""

    def __init__(self, budget: int) -> None:
        self.lock = threading.Lock()
        self.policy: UsagePolicy[tuple[int, str]] = UsagePolicy(budget)
        self._shares: dict[int, Share] = {}

    @property
    def budget(self) -> int:
        return self.policy.budget

    @property
    def total_bytes(self) -> int:
        return self.policy.total_bytes

    def share(self, evict: Callable[[str], None]) -> Share:
        """A new tier's account. `evict(key)`: another tier took the room of the tier's
        entry `key`, already uncounted; the tier forgets it (lock held)."""
        share = Share(self, next(_ids), evict)
        self._shares[share.id] = share
        return share

    def leave(self, share: Share) -> None:
        """`share` counts nothing any more and takes no part in evictions."""
        self._shares.pop(share.id, None)

    def _protected(self, own: Share, protect: Collection[str]) -> set[tuple[int, str]]:
        keys = {(own.id, key) for key in protect}
        for share in self._shares.values():
            keys.update((share.id, key) for key in share.pinned)
        return keys


class Share:
    """One tier's part of a Pool: UsagePolicy's calls, and the tier's own byte count."""

    def __init__(self, pool: Pool, share_id: int, evict: Callable[[str], None]) -> None:
        self.pool = pool
        self.id = share_id
        self._evict = evict
        self.total_bytes = 0
        self.pinned: set[str] = set()  # never evicted by anyone: a write in flight

    @property
    def budget(self) -> int:
        return self.pool.budget

    def add(self, key: str, nbytes: int) -> None:
        self.remove(key)
        self.pool.policy.add((self.id, key), nbytes)
        self.total_bytes += nbytes

    def remove(self, key: str) -> bool:
        nbytes = self.pool.policy.size((self.id, key))
        if not self.pool.policy.remove((self.id, key)):
            return False
        self.total_bytes -= nbytes
        return True

    def touch(self, key: str, hit: bool = True) -> None:
        self.pool.policy.touch((self.id, key), hit)

    def fits(self, nbytes: int) -> bool:
        return self.pool.policy.fits(nbytes)

    def victims(self, protect: Collection[str] = ()) -> list[str]:
        """Until the whole pool is within its budget: this tier's keys to remove (the
        caller removes them); other tiers' entries are evicted here, through their
        hooks. Protected and pinned keys are never chosen."""
        pool = self.pool
        mine: list[str] = []
        for share_id, key in pool.policy.victims(pool._protected(self, protect)):
            owner = pool._shares.get(share_id)
            if owner is self:
                mine.append(key)
            elif owner is None:  # a tier gone without emptying its share: not counted
                pool.policy.remove((share_id, key))
            elif owner.remove(key):
                owner._evict(key)
        return mine


class CacheBudget:
    """The RAM and disk pools of one process's prefix caches (see the module's text)."""

    def __init__(self, ram_bytes: int, disk_bytes: int) -> None:
        self.ram = Pool(ram_bytes)
        self.disk = Pool(disk_bytes)

    @classmethod
    def of(cls, config: CacheConfig) -> CacheBudget:
        """`[cache] ram_bytes` and `disk_bytes`, for the whole process."""
        return cls(config.ram_bytes, config.disk_bytes)
