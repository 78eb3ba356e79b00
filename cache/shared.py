"""The shared tier: a store every replica reads and writes (cache/redis_tier.py), behind
the local RAM and disk tiers, so a prefix computed on one replica is warm on the others
and a session's state outlives the replica that served it. A tier that is not indexed
(cache/tier.py): other replicas write there too, so it is searched (`find`).

It is never an error and never a stall: every store call is bounded by the store's
timeout, and a failure is counted (`errors`) and turns into a miss or a lost save. After
a failure the store is left alone for `retry_s`, so a dead store costs one timeout per
retry period, not one per request. Saves run on their own writer thread (a full queue
drops the save, counted), so a slow store never holds up the disk writes or the engine.

Threads: find() runs where PrefixCache.lookup runs (a worker thread of the event loop,
never the engine thread); put() only queues. The lock covers the counters. The lookups
it serves or not are counted by PrefixCache, as every tier's.

Traces: inside `recording_calls()` every store call is also noted as a `StoreCall` (the
engine records a lookup's calls, and server/telemetry/spans.py makes them spans); a
context variable, so the writer thread's saves and other lookups are never mixed in.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import cache.record as record
from cache.counters import TierIo
from cache.keys import block_hashes, seed
from cache.purges import PurgeLog
from cache.redis_tier import ERRORS, RedisTier
from cache.tier import Tier, TierContext
from cache.types import Entry, StoreCall, TierStats
from cache.writer import Writer

log = logging.getLogger(__name__)
T = TypeVar("T")
_recorded: contextvars.ContextVar[list[StoreCall] | None] = contextvars.ContextVar(
    "kvserve_store_calls", default=None
)


@contextlib.contextmanager
def recording_calls() -> Iterator[list[StoreCall]]:
    """The shared-store calls made in this block, on this thread (see the module doc)."""
    calls: list[StoreCall] = []
    token = _recorded.set(calls)
    try:
        yield calls
    finally:
        _recorded.reset(token)


class SharedStore(Protocol):
    address: str  # for traces: host or socket path
    port: int | None

    """What a shared store offers (Redis: cache/redis_tier.py). An entry is stored under
    a name of the store's own (`name_of`), which find() returns. Calls may raise the
    store's errors; get() raises record.CorruptRecord for a value that is not an entry."""

    name: str

    def find(self, hashes: Sequence[bytes], min_depth: int) -> list[tuple[int, str]]: ...
    def name_of(self, entry: Entry) -> str: ...
    def get(self, name: str) -> Entry | None: ...
    def put(self, entry: Entry, hashes: Sequence[bytes]) -> int: ...
    def touch(self, name: str, hashes: Sequence[bytes]) -> None: ...
    def delete(self, name: str) -> bool: ...
    def delete_where(self, owns: Callable[[str], bool]) -> int: ...
    def clear(self) -> int: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class _Put:
    entry: Entry
    generation: int


@dataclass
class _Counts:
    errors: int = 0
    io: TierIo = field(default_factory=TierIo)
    saves: int = 0
    saves_dropped: int = 0
    corrupt_removed: int = 0


class _Unavailable(Exception):
    """The store failed just now (counted) or is in its retry pause."""


class SharedTier(Tier):
    name = "shared"
    indexed = False
    blocking = True

    def __init__(
        self,
        store: SharedStore,
        errors: tuple[type[BaseException], ...],
        namespace: str,
        block_tokens: int,
        retry_s: float,
        max_pending: int,
    ) -> None:
        self._store = store
        self._errors = errors
        self._namespace = namespace
        self._block = block_tokens
        self._retry_s = retry_s
        self._lock = threading.Lock()
        self._counts = _Counts()
        self._down_until = 0.0
        self._down = False
        self._purges = PurgeLog()  # under the lock
        self._writer: Writer[_Put] = Writer(self._put, self._count_error, max_pending)

    # -- calls to the store ---------------------------------------------------------

    def _call(self, operation: str, fn: Callable[[], T]) -> T:
        """fn() timed and counted (and recorded, see `recording_calls`); raises
        _Unavailable on a store error or during the pause after one."""
        if time.monotonic() < self._down_until:
            raise _Unavailable()
        started = time.monotonic()
        try:
            result = fn()
        except BaseException as e:
            self._record(operation, started, f"{type(e).__name__}: {e}")
            if not isinstance(e, self._errors):
                raise
            with self._lock:
                self._counts.errors += 1
                self._down_until = time.monotonic() + self._retry_s
                was_down, self._down = self._down, True
            if not was_down:
                log.warning("cache: shared tier down (%s); next try in %gs", e, self._retry_s)
            raise _Unavailable() from e
        self._record(operation, started, None)
        with self._lock:
            self._counts.io.add(time.monotonic() - started)
            was_down, self._down = self._down, False
        if was_down:
            log.info("cache: shared tier reachable again")
        return result

    def _record(self, operation: str, started: float, error: str | None) -> None:
        calls = _recorded.get()
        if calls is not None:
            store = self._store
            calls.append(StoreCall(operation, started, time.monotonic(), store.address,
                                   store.port, error))  # fmt: skip

    def _count_error(self) -> None:
        with self._lock:
            self._counts.errors += 1

    # -- lookup ---------------------------------------------------------------------

    def find(
        self,
        prompt: tuple[int, ...],
        hashes: Sequence[bytes],
        salt: str,
        longer_than: int,
        whole: bool,
    ) -> tuple[Entry, int] | None:
        """See Tier.find: `longer_than` is the most the local tiers offer. A store that
        fails or is in its pause after an error is a miss."""
        found = self._find(prompt, hashes, salt, longer_than, whole)
        if found is not None:
            with self._lock:
                self._counts.io.bytes_read += len(found[0].state)
        return found

    def _find(
        self,
        prompt: tuple[int, ...],
        hashes: Sequence[bytes],
        salt: str,
        longer_than: int,
        whole: bool,
    ) -> tuple[Entry, int] | None:
        try:
            depth = longer_than // self._block
            candidates = self._call("find", lambda: self._store.find(hashes, depth))
            for depth, name in candidates:
                entry = self._load(name)
                shared = depth * self._block
                if entry is None or entry.salt != salt or entry.tokens[:shared] != prompt[:shared]:
                    continue  # expired, corrupt, or (never seen) a hash collision
                matched = _common_prefix(entry.tokens, prompt, shared)
                if whole and not matched == len(entry.tokens) < len(prompt):
                    continue  # a whole state of other tokens: of no use to this prompt
                if matched > longer_than:
                    self._renew(name, hashes[: matched // self._block])
                    return entry, matched
        except _Unavailable:
            pass
        return None

    def _renew(self, name: str, hashes: Sequence[bytes]) -> None:
        """A hit keeps the entry longer, and the block boundaries that lead to it (the
        prompt's `hashes` it matched): an entry kept without its pointers could no longer
        be found. Failing that costs nothing but a count."""
        with contextlib.suppress(_Unavailable):
            self._call("touch", lambda: self._store.touch(name, hashes))

    def _load(self, name: str) -> Entry | None:
        try:
            return self._call("get", lambda: self._store.get(name))
        except record.CorruptRecord as e:
            log.warning("cache: removing shared entry %s (%s)", name, e)
            with self._lock:
                self._counts.corrupt_removed += 1
            self._call("delete", lambda: self._store.delete(name))
            return None

    # -- save -----------------------------------------------------------------------

    def fits(self, entry: Entry) -> bool:
        return True  # the store's own memory limit is the budget (it evicts, LRU)

    def put(self, entry: Entry) -> list[str]:
        """Queue the entry for the store; never blocks (PrefixCache calls it under its
        lock). Dropped and counted when the queue is full or the store is in its pause
        after an error. What the store evicts is its own business: none listed."""
        with self._lock:
            job = _Put(entry, self._purges.generation)
            if time.monotonic() < self._down_until or not self._writer.submit(job):
                self._counts.saves_dropped += 1
        return []

    def _covered(self, job: _Put) -> bool:
        with self._lock:
            return self._purges.covers(job.generation, job.entry.salt)

    def _put(self, job: _Put) -> None:
        if self._covered(job):
            return  # purged after it was queued
        entry = job.entry
        hashes = block_hashes(entry.tokens, self._block, seed(self._namespace, entry.salt))
        try:
            size = self._call("put", lambda: self._store.put(entry, hashes))
            if self._covered(job):  # purged while it was being stored
                self._call("delete", lambda: self._store.delete(self._store.name_of(job.entry)))
                return
        except _Unavailable:
            return
        with self._lock:
            self._counts.saves += 1
            self._counts.io.bytes_written += size

    # -- admin ----------------------------------------------------------------------

    def clear(self) -> int:
        """Drop this namespace's shared entries (every replica's); 0 if unreachable."""
        with self._lock:
            self._purges.record()
        try:
            return self._call("clear", self._store.clear)
        except _Unavailable:
            log.warning("cache: a purge could not reach the shared tier")
            return 0

    def purge_where(self, owns: Callable[[str], bool]) -> int:
        """Drop the shared entries (every replica's) whose salt `owns` accepts: one
        tenant's. The number dropped; 0 if unreachable."""
        with self._lock:
            self._purges.record(owns)
        try:
            return self._call("delete_where", lambda: self._store.delete_where(owns))
        except _Unavailable:
            log.warning("cache: a tenant's purge could not reach the shared tier")
            return 0

    def stats(self) -> TierStats:
        with self._lock:
            c = self._counts
            counts = TierStats(
                errors=c.errors, saves_dropped=c.saves_dropped, corrupt_removed=c.corrupt_removed
            )
            return c.io.into(counts)

    def flush(self, timeout: float | None = None) -> bool:
        return self._writer.flush(timeout)

    def close(self, timeout: float | None = None) -> list[str]:
        """Store what is queued (each put bounded by the store's timeout), then let go."""
        self._writer.close(timeout)
        with contextlib.suppress(*self._errors):
            self._store.close()
        return []


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...], start: int) -> int:
    n = min(len(a), len(b))
    i = start
    while i < n and a[i] == b[i]:
        i += 1
    return i


def open_tier(context: TierContext) -> SharedTier | None:
    """On the store `[cache] shared_url` names (redis:// or rediss://, unix://), if any."""
    c = context.config
    if not c.shared_url:
        return None
    store = RedisTier(c.shared_url, context.namespace, c.shared_timeout_s, c.shared_ttl_s)
    return SharedTier(
        store, ERRORS, context.namespace, c.block_tokens, c.shared_retry_s, c.writer_queue
    )
