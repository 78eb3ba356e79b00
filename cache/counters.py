"""What the cache counts: PrefixCache's own counters (under its lock), beside each
tier's figures, and the timed I/O of a tier that stores outside the process."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from cache.types import CacheStats, TierStats


@dataclass
class Counters:
    """Per tier (by name): lookups it served or not, and writes to it that failed."""

    hits: dict[str, int] = field(default_factory=dict)
    misses: dict[str, int] = field(default_factory=dict)
    write_errors: dict[str, int] = field(default_factory=dict)
    saves: int = 0
    saves_dropped: int = 0
    save_errors: int = 0  # failed writes (every tier's) and failed store jobs
    saves_skipped: int = 0

    def count(self, table: dict[str, int], tier: str) -> None:
        table[tier] = table.get(tier, 0) + 1

    def tier_stats(self, name: str, stats: TierStats) -> TierStats:
        """A tier's own figures plus what PrefixCache counts for it: its lookups, and its
        failed writes among its errors."""
        return replace(
            stats,
            hits=self.hits.get(name, 0),
            misses=self.misses.get(name, 0),
            errors=stats.errors + self.write_errors.get(name, 0),
        )

    def cache_stats(self, tiers: dict[str, TierStats]) -> CacheStats:
        """The cache's report: each tier's own figures (by name, in order) with these."""
        mine = {name: self.tier_stats(name, stats) for name, stats in tiers.items()}
        return CacheStats(
            tiers=mine,
            saves=self.saves,
            saves_dropped=self.saves_dropped + sum(s.saves_dropped for s in mine.values()),
            save_errors=self.save_errors,
            saves_skipped=self.saves_skipped,
            corrupt_removed=sum(s.corrupt_removed for s in mine.values()),
        )


@dataclass
class TierIo:
    """A tier's timed reads and writes (disk, shared), counted under the tier's lock;
    `ops` and `seconds` give TierStats' mean I/O latency."""

    bytes_read: int = 0
    bytes_written: int = 0
    ops: int = 0
    seconds: float = 0.0

    def add(self, seconds: float, read: int = 0, written: int = 0) -> None:
        self.ops += 1
        self.seconds += seconds
        self.bytes_read += read
        self.bytes_written += written

    def into(self, stats: TierStats) -> TierStats:
        """`stats` (the tier's other figures) with these counts."""
        return replace(
            stats,
            bytes_read=self.bytes_read,
            bytes_written=self.bytes_written,
            io_ops=self.ops,
            io_seconds=self.seconds,
        )
