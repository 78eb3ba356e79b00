"""PrefixCache: the tiered store the engine talks to.

Threads: lookup() runs on the engine thread or a worker of the asyncio loop, save() on
the engine thread, and the writer thread (cache/writer.py) stores saves. One lock covers
the index, the tiers that are not blocking (RAM) and the counters, and is never held
across I/O: a blocking tier's read or write (cache/tier.py) happens between two short
critical sections.

Tiers: one ordered list (cache/tiers.py), fastest first, then the ones other replicas
write to. Invariant: every indexed entry is held by an indexed tier (cache/copies.py).
A save goes into every tier that takes it, in order (write-through: a lower tier already
holds what an upper one evicts, so demotion costs no write, and a crashed server
restarts warm): the tiers under the lock first (RAM: visible at once), then the blocking
ones (disk), then the ones other replicas write to (queued: their own writer thread).
While its blocking writes are in flight the entry is pinned in the tiers above them, so
it is never dropped before it is on disk. An eviction drops that tier's copy; an entry
left in no tier leaves the index. A lookup asks the tiers in order; a hit is promoted
into the tiers above it that are under the lock (a lookup never writes a file) and
touches its copies below. purge() and purge_where() start a new generation
(cache/purges.py), so saves queued or in flight before them that they cover are
discarded rather than landing afterwards, here and in the shared tier.

Several replicas (cache/shared.py): a lookup that the indexed tiers do not serve through
the prompt's last full block asks the shared tier for a longer prefix; a shared hit is
promoted to RAM. On a disk directory that other processes write too, such a lookup
picks up their new files first (DiskTier.refresh: one stat while nothing changed).

Several models in one process (cache/budget.py): caches of one CacheBudget share its RAM
and disk budgets and one lock (the RAM pool's); an entry another model's save evicts
leaves our index at once (RAM) or at our next lookup (disk: `_settle`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import takewhile

from cache.budget import CacheBudget
from cache.copies import Copies
from cache.counters import Counters
from cache.index import IndexedEntry
from cache.keys import block_hashes, entry_key, seed
from cache.purges import PurgeLog
from cache.tier import Opener, Tier, TierContext
from cache.tiers import TIERS
from cache.types import CacheConfig, CacheHit, CacheStats, Entry
from cache.writer import STALL_S, Writer

log = logging.getLogger(__name__)
_NAMESPACE_RE = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class _Save:
    entry: Entry
    hashes: tuple[bytes, ...]
    generation: int


class PrefixCache:
    """Longest-prefix KV state cache over an ordered list of tiers (RAM, disk, shared)."""

    def __init__(
        self,
        config: CacheConfig,
        namespace: str,
        budget: CacheBudget | None = None,
        tiers: Sequence[Opener] = TIERS,
    ) -> None:
        """`budget`: the process's, shared with the other models' caches (its sizes
        rule, not `config`'s); None: this cache's own, of `config`'s sizes. `tiers`:
        their openers, in lookup order (cache/tiers.py)."""
        if not _NAMESPACE_RE.fullmatch(namespace) or namespace in (".", ".."):
            raise ValueError(f"cache namespace must be a plain file name: {namespace!r}")
        self.config = config
        self.namespace = namespace
        self._block = config.block_tokens
        self._min_tokens = max(config.min_tokens, config.block_tokens)
        self._budget = budget or CacheBudget.of(config)
        self._lock = self._budget.ram.lock  # every cache of the budget's: see the module
        context = TierContext(config, namespace, self._budget, self._evicted)
        opened = [open_tier(context) for open_tier in tiers] if config.enabled else []
        self._tiers: tuple[Tier, ...] = tuple(tier for tier in opened if tier is not None)
        self._copies = Copies(config.block_tokens, namespace, self._tiers)
        self._index = self._copies.index
        self._local = self._copies.tiers  # the indexed ones, first in the list
        self._searched = tuple(tier for tier in self._tiers if not tier.indexed)
        # Set at load for recurrent and hybrid models (engine/family.py), before their first
        # request: an entry serves only prompts it is a proper prefix of, and a longer one
        # never replaces its prefixes (each is a checkpoint another prompt may restore).
        self.whole_states = False
        self._counts = Counters()
        self.stored = 0  # entries made visible in RAM so far (the engine's second look)
        self._purges = PurgeLog()
        self._closed = not config.enabled
        with self._lock:
            self._copies.index_stored()
        self._writer: Writer[_Save] | None = (
            Writer(self._store, self._count_error, config.writer_queue) if config.enabled else None
        )

    def tier(self, name: str) -> Tier | None:
        """The tier of that name, if configured."""
        return next((tier for tier in self._tiers if tier.name == name), None)

    def _evicted(self, tier: str, key: str) -> None:
        """Another model's save took the room of our `key` in `tier` (lock held: ours too)."""
        self._copies.drop(next(t for t in self._tiers if t.name == tier), [key])

    # -- lookup ---------------------------------------------------------------------------

    def lookup(self, tokens: Sequence[int], salt: str = "", held: bool = False) -> CacheHit | None:
        """The stored entry sharing the longest prefix with `tokens`, or None. `held`: in the
        tiers under the lock only (RAM): no I/O, not counted (engine/thread/relookup.py)."""
        if not self.config.enabled:
            return None
        prompt = tuple(tokens)
        hashes = block_hashes(prompt, self._block, seed(self.namespace, salt))
        if held or not hashes:  # (no full block: a miss in every tier)
            return self._lookup_local(prompt, hashes, held)
        full = len(hashes) * self._block
        self._refresh()
        generation = self._purges.generation
        hit = self._lookup_local(prompt, hashes, False)
        for tier in self._searched:  # each asked only for more than the tiers before it
            if hit is not None and hit.num_matched >= full:
                break
            longer_than = hit.num_matched if hit else 0
            found = tier.find(prompt, hashes, salt, longer_than, self.whole_states)
            if found is None:
                with self._lock:
                    self._counts.count(self._counts.misses, tier.name)
                continue
            entry, num_matched = found
            self._adopt(tier, entry, generation)
            return CacheHit(entry.tokens, entry.state, num_matched, tier.name)
        return hit

    def _refresh(self) -> None:
        """Index the files other processes added to a shared disk directory and forget
        the ones they removed (nothing but a stat while the directory is unchanged)."""
        self._settle()
        for tier in self._local:
            if tier.changed():
                added, removed = tier.refresh()
                with self._lock:
                    self._copies.take_refresh(tier, added, removed)

    def _settle(self) -> None:
        """Forget the copies another model's writes evicted (a shared budget)."""
        for tier in self._local:
            if lost := tier.take_lost():
                with self._lock:
                    self._copies.sync(lost)

    def _lookup_local(
        self, prompt: tuple[int, ...], hashes: list[bytes], held: bool
    ) -> CacheHit | None:
        """The indexed tiers in order (`held`: those under the lock): the best match is read
        from the first that holds it; each tier before it, or all if none does, counts a miss."""
        copies = self._copies
        tiers = tuple(takewhile(lambda t: not t.blocking, self._local)) if held else self._local
        counts = Counters() if held else self._counts  # a second look: the first one counted
        with self._lock:
            find = self._index.longest_prefix_entry if self.whole_states else self._index.best_match
            match = find(prompt, hashes, prefer=copies.in_memory)
            if match is None:
                for tier in tiers:
                    counts.count(counts.misses, tier.name)
                return None
            indexed, num_matched = match
            for n, tier in enumerate(tiers):
                entry = self._read(tier, indexed) if copies.holds(indexed, tier) else None
                if entry is None:
                    counts.count(counts.misses, tier.name)
                    continue
                counts.count(counts.hits, tier.name)
                copies.touch_below(indexed, n)  # keeps hot entries' files from eviction
                self._promote(entry, indexed, self._local[:n])
                return CacheHit(entry.tokens, entry.state, num_matched, tier.name)
            return None

    def _read(self, tier: Tier, indexed: IndexedEntry) -> Entry | None:
        """The tier's copy (lock held; released around a blocking tier's read). A copy
        gone meanwhile, or found corrupt (and removed), is forgotten."""
        key = indexed.info.key
        if not tier.blocking:
            return tier.get(key)
        self._lock.release()
        try:
            entry = tier.get(key)
        finally:
            self._lock.acquire()
        if entry is None:
            self._copies.sync([key])
        return entry

    def _promote(self, entry: Entry, indexed: IndexedEntry, above: Sequence[Tier]) -> None:
        """Copy a hit into the tiers `above` that are under the lock and lack it, where it
        fits (lock held; a write in flight is pinned there). Not if `indexed`, read
        outside the lock, is no longer the index's."""
        if self._index.get(entry.key) is not indexed:
            return
        for tier in above:
            if not tier.blocking and not tier.contains(entry.key) and tier.fits(entry):
                self._copies.drop(tier, tier.put(entry))

    def _adopt(self, found_in: Tier, entry: Entry, generation: int) -> None:
        """A searched tier's hit is counted and promoted (the next lookup here is local),
        unless a purge since the lookup began (`generation`) covers it."""
        hashes = tuple(block_hashes(entry.tokens, self._block, seed(self.namespace, entry.salt)))
        with self._lock:
            self._counts.count(self._counts.hits, found_in.name)
            if self._closed or self._index.get(entry.key) is not None or not hashes:
                return
            if self._purges.covers(generation, entry.salt):
                return
            indexed = IndexedEntry(entry.info, hashes)
            self._index.add(indexed)
            self._promote(entry, indexed, self._local)
            self._copies.forget_if_unheld(indexed)

    # -- save -----------------------------------------------------------------------------

    def save(self, tokens: Sequence[int], state: bytes, salt: str = "", wait: bool = False) -> bool:
        """Queue `state` (the KV state for exactly `tokens`); blocks only to `wait` for room
        (a drain; while the writer progresses). False if not taken: closed or disabled,
        shorter than max(min_tokens, block_tokens), or the queue full (counted, dropped)."""
        writer = self._writer
        if writer is None or self._closed or len(tokens) < self._min_tokens:
            return False
        prompt = tuple(tokens)
        chain_seed = seed(self.namespace, salt)
        entry = Entry(entry_key(chain_seed, prompt), salt, prompt, state)
        hashes = tuple(block_hashes(prompt, self._block, chain_seed))
        with self._lock:
            if not any(tier.fits(entry) for tier in self._local):
                self._counts.saves_dropped += 1
                return False
            if self._covered(entry, hashes):
                self._counts.saves_skipped += 1
                return True
            job = _Save(entry, hashes, self._purges.generation)
        if writer.submit(job, wait=wait):  # outside the lock: the writer's job takes it
            return True
        with self._lock:
            self._counts.saves_dropped += 1
        return False

    def _covered(self, entry: Entry, hashes: tuple[bytes, ...]) -> bool:
        """A stored entry starts with all of `entry`'s tokens (whole states: has exactly them)."""
        if self.whole_states:
            return self._index.get(entry.key) is not None
        return self._index.covering(entry.tokens, hashes) is not None

    def _count_error(self) -> None:
        with self._lock:
            self._counts.save_errors += 1

    def _store(self, job: _Save) -> None:
        """The writer thread: the entry into every tier that takes it (see the module)."""
        entry, hashes = job.entry, job.hashes
        indexed = IndexedEntry(entry.info, hashes)
        with self._lock:
            if self._purges.covers(job.generation, entry.salt):
                return  # purged after it was queued
            if self._covered(entry, hashes):
                self._counts.saves_skipped += 1
                return
            # A growing conversation keeps one entry: the new one replaces its prefixes
            # (whole states keep them: see `whole_states`).
            for old in () if self.whole_states else self._index.extended_by(entry.tokens, hashes):
                self._copies.remove(old.info.key)
            for tier in self._local:
                if not tier.blocking and tier.fits(entry):
                    if self._index.get(entry.key) is None:
                        self._index.add(indexed)
                    tier.pin(entry.key)  # not evicted before the blocking tiers have it
                    self._copies.drop(tier, tier.put(entry))
                    self.stored += 1
        written: dict[Tier, list[str]] = {}  # the blocking tiers written: the keys they evicted
        for tier in self._local:
            if tier.blocking and (evicted := self._write_to(tier, entry)) is not None:
                written[tier] = evicted
        with self._lock:
            purged = self._purges.covers(job.generation, entry.salt)
            for tier in self._searched:  # under the lock: a purge after this covers it there
                if not purged:
                    tier.put(entry)  # never blocks: their own writer thread
            for tier in self._local:
                tier.pin(None)
            if purged:  # purged during the writes
                for tier in written:
                    tier.delete(entry.key)
                return
            if written and self._index.get(entry.key) is None:
                self._index.add(indexed)
            # Another model's write may have evicted it already (cache/budget.py).
            self._copies.sync([entry.key, *(key for keys in written.values() for key in keys)])
            for tier in self._local:  # a pinned entry may have overrun a budget
                self._copies.drop(tier, tier.trim())
            if self._index.get(entry.key) is not None:
                self._counts.saves += 1

    def _write_to(self, tier: Tier, entry: Entry) -> list[str] | None:
        """A blocking indexed tier's copy, written outside the lock: the keys it evicted,
        or None if not written. A failed write costs only this copy (temporary file
        already removed): counted in save_errors and the tier's errors."""
        if not tier.fits(entry):
            return None
        try:
            return tier.put(entry)
        except OSError as e:
            log.warning("cache: writing an entry to the %s tier failed: %s", tier.name, e)
            with self._lock:
                self._counts.save_errors += 1
                self._counts.count(self._counts.write_errors, tier.name)
            return None

    # -- admin ----------------------------------------------------------------------------

    def purge(self) -> int:
        """Drop every entry of this namespace in every tier; the number of entries."""
        with self._lock:
            self._purges.record()
            keys = self._index.keys()
            for key in keys:
                self._index.remove(key)
            for tier in self._tiers:
                if not tier.blocking:
                    tier.clear()
        for tier in self._tiers:  # file deletions, every replica's shared entries
            if tier.blocking:  # outside the store's lock
                tier.clear()
        return len(keys)

    def entries_of(self, owns: Callable[[str], bool]) -> tuple[int, int]:
        """(entries, tokens) of the stored prefixes whose salt `owns` accepts: one
        tenant's share of the cache, for its own view of it."""
        self._settle()
        with self._lock:
            mine = [e for e in self._index.entries() if owns(e.info.salt)]
            return len(mine), sum(len(e.tokens) for e in mine)

    def purge_where(self, owns: Callable[[str], bool]) -> int:
        """Drop the entries whose salt `owns` accepts (one tenant's) in every tier: RAM,
        disk (with the files other replicas added to a shared directory) and the shared
        store (every replica's). Saves of those salts queued before are discarded. Returns
        the number dropped from the indexed tiers."""
        self._refresh()
        with self._lock:
            self._purges.record(owns)
            keys = [e.info.key for e in self._index.entries() if owns(e.info.salt)]
            for key in keys:
                self._copies.remove(key)
        for tier in self._searched:
            tier.purge_where(owns)
        return len(keys)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every accepted save is stored (or failed); False on timeout."""
        local = self._writer is None or self._writer.flush(timeout)
        return all([tier.flush(timeout) for tier in self._tiers]) and local

    def close(self, timeout: float | None = STALL_S) -> None:
        """Refuse new saves, store the queued ones (giving up on a writer that finished
        none for `timeout` s: those are logged and counted as dropped), stop the writer."""
        with self._lock:
            self._closed = True
        lost = self._writer.close(timeout) if self._writer is not None else 0
        with self._lock:  # a stuck writer's saves, logged by it
            self._counts.saves_dropped += lost
            # Its RAM goes back to the process's budget (a deleted model's, or at exit).
            for tier in self._tiers:
                if not tier.blocking:
                    self._copies.drop(tier, tier.close(timeout))
        for tier in self._tiers:  # after the writer: it queues their saves
            if tier.blocking and (released := tier.close(timeout)):
                with self._lock:
                    self._copies.drop(tier, released)

    # -- reports --------------------------------------------------------------------------

    def stats(self) -> CacheStats:
        own = {tier.name: tier.stats() for tier in self._tiers if tier.blocking}
        with self._lock:
            own |= {tier.name: tier.stats() for tier in self._tiers if not tier.blocking}
            return self._counts.cache_stats({tier.name: own[tier.name] for tier in self._tiers})

    def check_integrity(self) -> None:
        """Raise RuntimeError unless the index and the tiers agree. For tests and idle
        moments: call it after flush(), with no save in flight."""
        self._settle()
        with self._lock:
            problems = self._copies.problems()
        if problems:
            raise RuntimeError("; ".join(problems))
