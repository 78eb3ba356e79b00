"""What PrefixCache counts itself (under its lock), beside each tier's own figures."""

from __future__ import annotations

from dataclasses import dataclass, replace

from cache.types import TierStats


@dataclass
class Counters:
    ram_hits: int = 0
    ram_misses: int = 0
    disk_hits: int = 0
    disk_misses: int = 0
    saves: int = 0
    saves_dropped: int = 0
    save_errors: int = 0
    saves_skipped: int = 0

    def disk_stats(self, stats: TierStats) -> TierStats:
        """The disk tier's own figures plus what PrefixCache counts for it (its errors:
        unreadable files and failed writes)."""
        return replace(
            stats,
            hits=self.disk_hits,
            misses=self.disk_misses,
            errors=stats.errors + self.save_errors,
        )
