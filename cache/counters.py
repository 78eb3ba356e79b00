"""What the cache counts: PrefixCache's own counters (under its lock), beside each
tier's figures, and the timed I/O of a tier that stores outside the process."""

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
