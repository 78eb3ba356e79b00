"""What a PrefixCache reports: its stats, and the check of its invariants.

A mixin of `PrefixCache` (cache/store.py), which owns the state named below and whose
thread contract holds here: `_lock` covers the index, the RAM tier and the counters.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import TYPE_CHECKING

from cache.types import CacheStats, TierStats

if TYPE_CHECKING:
    from cache.budget import CacheBudget
    from cache.counters import Counters
    from cache.disk import DiskTier
    from cache.index import BlockIndex
    from cache.ram import RamTier
    from cache.shared import SharedTier


class Reports:
    _lock: threading.Lock
    _budget: CacheBudget
    _counts: Counters
    _index: BlockIndex
    _ram: RamTier
    _disk: DiskTier | None
    _shared: SharedTier | None

    if TYPE_CHECKING:  # defined by PrefixCache

        def _settle_disk(self) -> None: ...

    def stats(self) -> CacheStats:
        shared = self._shared.stats() if self._shared is not None else None
        dropped, corrupt = self._shared.dropped_and_corrupt() if self._shared else (0, 0)
        with self._lock:
            c, disk = self._counts, self._disk
            return CacheStats(
                ram=replace(self._ram.stats(), hits=c.ram_hits, misses=c.ram_misses),
                disk=c.disk_stats(disk.stats()) if disk else TierStats(),
                shared=shared,
                saves=c.saves,
                saves_dropped=c.saves_dropped + dropped,
                save_errors=c.save_errors,
                saves_skipped=c.saves_skipped,
                corrupt_removed=(disk.corrupt_removed if disk else 0) + corrupt,
            )

    def check_integrity(self) -> None:
        """Raise RuntimeError unless the index and the tiers agree. For tests and idle
        moments: call it after flush(), with no save in flight."""
        self._settle_disk()
        with self._lock:
            in_ram = {info.key for info in self._ram.infos()}
            on_disk = {info.key for info in self._disk.infos()} if self._disk else set()
            problems = [f"{k}: not indexed" for k in (in_ram | on_disk) - set(self._index.keys())]
            for indexed in self._index.entries():
                key = indexed.info.key
                if indexed.on_disk != (key in on_disk) or key not in in_ram | on_disk:
                    problems.append(f"{key}: the index is wrong about where it is")
            ram, disk_pool = self._budget.ram, self._budget.disk
            if ram.total_bytes > ram.budget:
                problems.append("the RAM tier is over budget")
            if self._disk and disk_pool.total_bytes > disk_pool.budget:
                problems.append("the disk tier is over budget")
        if problems:
            raise RuntimeError("; ".join(problems))
