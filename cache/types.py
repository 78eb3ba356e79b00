"""The plain values the cache hands across threads: config, hits, stats and entries."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

AUTO_DISK_DIR = "auto"  # disk_dir: the user's cache directory (default_cache_dir())
SHARED_SCHEMES = ("redis://", "rediss://", "unix://")


def default_cache_dir() -> str:
    """Where the disk tier lives for disk_dir = "auto": the user's cache directory (XDG),
    so a plain restart is warm. The Docker image sets /var/cache/kvserve instead."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "kvserve")


@dataclass(frozen=True)
class CacheConfig:
    """How the prefix cache is sized. Entries need at least one full block to be found,
    so prefixes shorter than max(min_tokens, block_tokens) are never stored."""

    enabled: bool = True
    # Key granularity: a stored prefix is found through the deepest block it shares with
    # the prompt, then matched token by token. 16 rather than 64: prompts that part from a
    # stored one a few dozen tokens in (one system prompt, then each user's question)
    # find it, as llama-server's prompt cache does (issue 48: c=8 TTFT); a lookup of 20k
    # tokens hashes in 1.0 ms instead of 0.6.
    block_tokens: int = 16
    ram_bytes: int = 1 << 30  # RAM tier budget
    disk_dir: str = ""  # "" = no disk tier; "auto": default_cache_dir()
    disk_bytes: int = 8 << 30  # disk tier budget
    writer_queue: int = 4  # pending saves; a full queue drops the save (counted)
    # Don't store shorter prefixes: one block by default. A short prompt that a prompt
    # sharing its head pushed out of its slot is then found again in RAM, as in
    # llama-server's prompt cache (a 63-token prompt sent again: 17 ms, not 70-115).
    min_tokens: int = 16
    shared_url: str = ""  # redis://host:port/db of the tier shared by replicas; "" = none
    shared_timeout_s: float = 1.0  # one shared-store operation; past it, a counted miss
    shared_retry_s: float = 2.0  # after a shared-store error, skip it this long
    shared_ttl_s: float = 86400.0  # shared entries expire (the store also evicts, LRU)

    def __post_init__(self) -> None:
        # The one check of these values: CacheConfig is the server's [cache] section,
        # which reports this error against its `cache.` key (issue 17).
        for name, (ok, rule) in _RANGES.items():
            if not ok(getattr(self, name)):
                raise ValueError(f"{name}: {rule}, got {getattr(self, name)!r}")
        if self.shared_url and not self.shared_url.startswith(SHARED_SCHEMES):
            raise ValueError(f"shared_url: must start with {', '.join(SHARED_SCHEMES)}")

    @property
    def disk_path(self) -> str:
        """The disk tier's directory, "auto" resolved; "" when the tier is off."""
        return default_cache_dir() if self.disk_dir == AUTO_DISK_DIR else self.disk_dir


# field -> (test, what it needs)
_RANGES: dict[str, tuple[Callable[[float], bool], str]] = {
    "block_tokens": (lambda v: v >= 1, "must be at least 1"),
    "ram_bytes": (lambda v: v >= 0, "must not be negative"),
    "disk_bytes": (lambda v: v >= 0, "must not be negative"),
    "writer_queue": (lambda v: v >= 1, "must be at least 1"),
    "min_tokens": (lambda v: v >= 0, "must not be negative"),
    "shared_timeout_s": (lambda v: v > 0, "must be above 0"),
    "shared_retry_s": (lambda v: v >= 0, "must not be negative"),
    "shared_ttl_s": (lambda v: v >= 1, "must be at least 1 (second)"),
}


@dataclass(frozen=True)
class CacheHit:
    tokens: tuple[int, ...]  # the stored entry's full token ids
    state: bytes  # the stored KV state blob
    num_matched: int  # common prefix length between the looked-up prompt and `tokens`
    tier: str  # the name of the tier that served it: "ram", "disk", "shared"


@dataclass(frozen=True, slots=True)
class StoreCall:
    """One call a lookup made to the shared store, for the request's trace
    (server/telemetry/spans.py): which, when (time.monotonic() seconds), to which store
    (host or unix socket path, never credentials), and why it failed (None: it did not)."""

    operation: str  # find, get, touch or delete
    start: float
    end: float
    address: str
    port: int | None
    error: str | None = None


@dataclass(frozen=True)
class TierStats:
    """One tier's contents and counters. A lookup asks the tiers in order (cache/tier.py):
    one a tier does not serve is a miss there, and goes on to the next. The indexed tiers
    (RAM, disk) are asked for the longest stored prefix; one they did not serve through
    its last full block goes on to the tiers other replicas write to (shared): a longer
    prefix there is a hit, anything else a miss (the shared tier's entries/bytes are not
    known: other replicas write there too)."""

    entries: int = 0
    bytes: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    errors: int = 0  # I/O that failed (a miss or a lost save, never an error upstream)
    bytes_read: int = 0  # entries loaded from this tier (disk, shared)
    bytes_written: int = 0  # entries stored to it
    io_ops: int = 0  # timed reads and writes: io_seconds / io_ops is the mean latency
    io_seconds: float = 0.0
    saves_dropped: int = 0  # saves its own queue refused (part of CacheStats.saves_dropped)
    corrupt_removed: int = 0  # entries found corrupt or foreign, and deleted


@dataclass(frozen=True)
class CacheStats:
    """`tiers`: each tier's stats by name, in lookup order ("ram", "disk", "shared": the
    ones configured). `saves`: entries stored; `saves_dropped`: refused because a writer
    queue was full or the entry fits in no tier; `save_errors`: writes that failed (the
    entry stays in the tiers that took it); `saves_skipped`: already covered by a stored
    entry that starts with the same tokens; `corrupt_removed`: entries found truncated,
    corrupt, foreign or left over from an interrupted write, and deleted."""

    tiers: Mapping[str, TierStats] = field(default_factory=dict)
    saves: int = 0
    saves_dropped: int = 0
    save_errors: int = 0
    saves_skipped: int = 0
    corrupt_removed: int = 0

    @property
    def ram(self) -> TierStats:
        return self.tiers.get("ram", _NONE)

    @property
    def disk(self) -> TierStats:
        """Zeros when there is no disk tier."""
        return self.tiers.get("disk", _NONE)

    @property
    def shared(self) -> TierStats | None:
        """None: no shared tier configured."""
        return self.tiers.get("shared")


_NONE = TierStats()


@dataclass(frozen=True)
class EntryInfo:
    """What the index needs of an entry: everything but the state."""

    key: str
    salt: str
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class Entry:
    """One stored prefix: the tier-level value (tiers take and give whole entries)."""

    key: str  # keys.entry_key(): unique per namespace, salt and tokens
    salt: str
    tokens: tuple[int, ...]
    state: bytes

    @property
    def info(self) -> EntryInfo:
        return EntryInfo(self.key, self.salt, self.tokens)

    @property
    def nbytes(self) -> int:
        """RAM footprint used for the budget: the state plus the packed token ids."""
        return len(self.state) + 4 * len(self.tokens) + len(self.salt)
