"""PrefixCache: the tiered store the engine talks to.

Threads: lookup() runs on the engine thread or a worker of the asyncio loop, save() on
the engine thread, and the writer thread (cache/writer.py) stores saves. One lock covers
the index, the RAM tier and the counters, and is never held across file I/O: a disk
load or write happens between two short critical sections.

Invariant: every indexed entry is in RAM, on disk, or both. A saved entry goes into RAM
first (visible at once), then to disk (write-through, so a crashed server restarts
warm); while its write is in flight it is protected from RAM eviction, so it is never
dropped before it is on disk. Later RAM eviction drops only the RAM copy; an entry left
on no tier leaves the index. purge() and purge_where() start a new generation
(cache/purges.py), so saves queued or in flight before them that they cover are
discarded rather than landing afterwards, here and in the shared tier.

Several replicas (cache/shared.py): a stored entry is also queued for the shared tier
(its own writer thread), and a lookup that the local tiers do not serve through the
prompt's last full block asks the shared tier for a longer prefix; a shared hit is
promoted to RAM. On a disk directory that other processes write too, such a lookup
picks up their new files first (DiskTier.refresh: one stat while nothing changed).

Several models in one process (cache/budget.py): caches made with one CacheBudget count
their RAM and disk bytes in one budget each, and share one lock (the RAM pool's), so a
save of one model may evict another's entry, in its index at once; its disk copies that
another's write evicted it learns of at its next lookup (`_settle_disk`).

An entry's `on_disk` is copied from the disk tier under the lock (`_sync_disk_copy`),
never from a list of keys made outside it (a refresh's, a write's, another model's):
the file may have come or gone again since."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cache.budget import CacheBudget
from cache.counters import Counters
from cache.disk import DiskTier
from cache.index import BlockIndex, IndexedEntry
from cache.keys import block_hashes, entry_key, seed
from cache.purges import PurgeLog
from cache.ram import RamTier
from cache.shared import SharedTier, connect
from cache.store_reports import Reports
from cache.types import CacheConfig, CacheHit, Entry, Tier
from cache.writer import STALL_S, Writer

if TYPE_CHECKING:  # both tiers offer the narrow interface another tier would implement
    _TIERS: tuple[type[Tier], ...] = (RamTier, DiskTier)

log = logging.getLogger(__name__)
_NAMESPACE_RE = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class _Save:
    entry: Entry
    hashes: tuple[bytes, ...]
    generation: int


class PrefixCache(Reports):
    """Longest-prefix KV state cache over a RAM tier and an optional disk tier."""

    def __init__(
        self, config: CacheConfig, namespace: str, budget: CacheBudget | None = None
    ) -> None:
        """`budget`: the process's, shared with the other models' caches (its sizes
        rule, not `config`'s); None: this cache's own, of `config`'s sizes."""
        if not _NAMESPACE_RE.fullmatch(namespace) or namespace in (".", ".."):
            raise ValueError(f"cache namespace must be a plain file name: {namespace!r}")
        self.config = config
        self.namespace = namespace
        self._block = config.block_tokens
        self._min_tokens = max(config.min_tokens, config.block_tokens)
        self._budget = budget or CacheBudget.of(config)
        self._lock = self._budget.ram.lock  # every cache of the budget's: see the module
        self._index = BlockIndex(config.block_tokens)
        self._ram = RamTier(self._budget.ram, on_evict=self._ram_evicted)
        self._disk = (
            DiskTier(config.disk_path, namespace, self._budget.disk)
            if config.enabled and config.disk_path
            else None
        )
        self._shared: SharedTier | None = (
            connect(
                config.shared_url,
                namespace,
                config.block_tokens,
                timeout_s=config.shared_timeout_s,
                retry_s=config.shared_retry_s,
                ttl_s=config.shared_ttl_s,
                max_pending=config.writer_queue,
            )
            if config.enabled and config.shared_url
            else None
        )
        # Set at load for recurrent and hybrid models (engine/family.py), before their first
        # request: an entry serves only prompts it is a proper prefix of, and a longer one
        # never replaces its prefixes (each is a checkpoint another prompt may restore).
        self.whole_states = False
        self._counts = Counters()
        self._purges = PurgeLog()
        self._closed = not config.enabled
        self._load_disk_index()
        self._writer: Writer[_Save] | None = (
            Writer(self._store, self._count_error, config.writer_queue) if config.enabled else None
        )

    def _load_disk_index(self) -> None:
        if self._disk is None:
            return
        for info in self._disk.infos():
            hashes = block_hashes(info.tokens, self._block, seed(self.namespace, info.salt))
            if hashes:
                self._index.add(IndexedEntry(info, tuple(hashes), on_disk=True))
            else:  # shorter than a block (block_tokens grew): can never be found
                self._disk.delete(info.key)

    # -- lookup ---------------------------------------------------------------------------

    def lookup(self, tokens: Sequence[int], salt: str = "") -> CacheHit | None:
        """The stored entry sharing the longest prefix with `tokens`, or None."""
        if not self.config.enabled:
            return None
        if len(tokens) < self._block:
            with self._lock:
                self._count_miss(ram=True)
            return None
        prompt = tuple(tokens)
        hashes = block_hashes(prompt, self._block, seed(self.namespace, salt))
        full = len(hashes) * self._block
        self._refresh_disk()
        generation = self._purges.generation
        hit = self._lookup_local(prompt, hashes)
        if self._shared is None or (hit is not None and hit.num_matched >= full):
            return hit
        longer_than, whole = (hit.num_matched if hit else 0), self.whole_states
        found = self._shared.lookup(prompt, hashes, salt, longer_than, whole=whole)
        if found is None:
            return hit
        entry, num_matched = found
        self._adopt(entry, generation)
        return CacheHit(entry.tokens, entry.state, num_matched, "shared")

    def _refresh_disk(self) -> None:
        """Index the files other processes added to a shared disk directory and forget
        the ones they removed (nothing but a stat while the directory is unchanged)."""
        self._settle_disk()
        disk = self._disk
        if disk is None or not disk.changed():
            return
        added, removed = disk.refresh()
        with self._lock:
            for key in removed:
                self._sync_disk_copy(key)
            for info in added:
                if self._index.get(info.key) is not None:
                    self._sync_disk_copy(info.key)
                    continue
                if not disk.contains(info.key):  # our writer's save evicted it meanwhile
                    continue
                hashes = block_hashes(info.tokens, self._block, seed(self.namespace, info.salt))
                if hashes:
                    self._index.add(IndexedEntry(info, tuple(hashes), on_disk=True))

    def _settle_disk(self) -> None:
        """Forget the disk copies another model's writes evicted (a shared budget)."""
        lost = self._disk.take_lost() if self._disk is not None else []
        if lost:
            with self._lock:
                for key in lost:
                    self._sync_disk_copy(key)

    def _ram_evicted(self, key: str) -> None:
        """Another model's save took this entry's RAM (lock held: it is ours too)."""
        self._drop_ram_copies([key])

    def _adopt(self, entry: Entry, generation: int) -> None:
        """A shared hit goes into RAM (the next lookup here is local), unless a purge
        since the lookup began (`generation`) covers it."""
        hashes = tuple(block_hashes(entry.tokens, self._block, seed(self.namespace, entry.salt)))
        with self._lock:
            if self._closed or self._index.get(entry.key) is not None or not hashes:
                return
            if self._purges.covers(generation, entry.salt):
                return
            if self._ram.fits(entry):
                self._index.add(IndexedEntry(entry.info, hashes))
                self._drop_ram_copies(self._ram.put(entry))

    def _lookup_local(self, prompt: tuple[int, ...], hashes: list[bytes]) -> CacheHit | None:
        """RAM, then disk (a disk hit is promoted to RAM)."""
        with self._lock:
            find = self._index.longest_prefix_entry if self.whole_states else self._index.best_match
            match = find(prompt, hashes, prefer=self._ram.contains)
            if match is None:
                self._count_miss(ram=True)
                return None
            indexed, num_matched = match
            key = indexed.info.key
            entry = self._ram.get(key)
            if entry is not None:
                self._counts.ram_hits += 1
                if self._disk is not None:
                    self._disk.touch(key)  # keeps hot entries' files from disk eviction
                return CacheHit(entry.tokens, entry.state, num_matched, "ram")
            self._counts.ram_misses += 1
            if self._disk is None or not indexed.on_disk:
                self._count_miss(ram=False)
                return None
            disk = self._disk
        entry = disk.get(key)  # the read happens outside the lock
        with self._lock:
            if entry is None:  # deleted meanwhile, or found corrupt (and removed)
                self._count_miss(ram=False)
                self._sync_disk_copy(key)
                return None
            self._counts.disk_hits += 1
            promote = self._index.get(key) is indexed and not self._ram.contains(key)
            if promote and self._ram.fits(entry):  # (a write in flight is pinned)
                self._drop_ram_copies(self._ram.put(entry))
            return CacheHit(entry.tokens, entry.state, num_matched, "disk")

    def _count_miss(self, ram: bool) -> None:
        """A lookup no tier served (`ram`: RAM was not counted for it yet)."""
        if ram:
            self._counts.ram_misses += 1
        if self._disk is not None:
            self._counts.disk_misses += 1

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
            if not (self._ram.fits(entry) or (self._disk is not None and self._disk.fits(entry))):
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
                self._remove(old.info.key)
            if self._ram.fits(entry):
                self._index.add(indexed)
                self._ram.pin(entry.key)  # not evicted before it is on disk
                self._drop_ram_copies(self._ram.put(entry))
        written, evicted = self._write_to_disk(entry)
        with self._lock:
            # Queued under the lock: a purge after this check covers it in the shared tier.
            if self._shared is not None and not self._purges.covers(job.generation, entry.salt):
                self._shared.save(entry, hashes)  # never blocks: its own writer thread
            self._ram.pin(None)
            if self._purges.covers(job.generation, entry.salt):  # purged during the write
                if written and self._disk is not None:
                    self._disk.delete(entry.key)
                return
            if written and self._index.get(entry.key) is None:
                self._index.add(indexed)
            # Another model's write may have evicted it already (cache/budget.py).
            for key in (entry.key, *evicted):
                self._sync_disk_copy(key)
            self._drop_ram_copies(self._ram.trim())  # the protected write may have overrun
            if self._index.get(entry.key) is not None:
                self._counts.saves += 1

    def _write_to_disk(self, entry: Entry) -> tuple[bool, list[str]]:
        """(written, keys evicted from disk). A failed write costs only this entry's
        disk copy: counted in save_errors, temporary file already removed."""
        if self._disk is None or not self._disk.fits(entry):
            return False, []
        try:
            return True, self._disk.put(entry)
        except OSError as e:
            log.warning("cache: writing an entry to %s failed: %s", self._disk.dir, e)
            with self._lock:
                self._counts.save_errors += 1
            return False, []

    # -- tier bookkeeping (lock held) -----------------------------------------------------

    def _drop_ram_copies(self, evicted: list[str]) -> None:
        """RAM evicted these: entries with no disk copy are gone."""
        for key in evicted:
            indexed = self._index.get(key)
            if indexed is not None and not indexed.on_disk:
                self._index.remove(key)

    def _sync_disk_copy(self, key: str) -> None:
        """The indexed entry `key` is on disk if the disk tier has it now; one on no
        tier leaves the index."""
        indexed = self._index.get(key)
        if indexed is not None:
            indexed.on_disk = self._disk is not None and self._disk.contains(key)
            if not indexed.on_disk and not self._ram.contains(key):
                self._index.remove(key)

    def _remove(self, key: str) -> None:
        self._index.remove(key)
        self._ram.delete(key)
        if self._disk is not None:
            self._disk.delete(key)

    # -- admin ----------------------------------------------------------------------------

    def purge(self) -> int:
        """Drop every entry of this namespace in both tiers; the number of entries."""
        with self._lock:
            self._purges.record()
            keys = self._index.keys()
            for key in keys:
                self._index.remove(key)
            self._ram.clear()
        if self._disk is not None:  # file deletions outside the store's lock
            self._disk.clear()
        if self._shared is not None:  # every replica's entries of this namespace
            self._shared.clear()
        return len(keys)

    def entries_of(self, owns: Callable[[str], bool]) -> tuple[int, int]:
        """(entries, tokens) of the stored prefixes whose salt `owns` accepts: one
        tenant's share of the cache, for its own view of it."""
        self._settle_disk()
        with self._lock:
            mine = [e for e in self._index.entries() if owns(e.info.salt)]
            return len(mine), sum(len(e.tokens) for e in mine)

    def purge_where(self, owns: Callable[[str], bool]) -> int:
        """Drop the entries whose salt `owns` accepts (one tenant's) in every tier: RAM,
        disk (with the files other replicas added to a shared directory) and the shared
        store (every replica's). Saves of those salts queued before are discarded. Returns
        the number dropped from the local tiers."""
        self._refresh_disk()
        with self._lock:
            self._purges.record(owns)
            keys = [e.info.key for e in self._index.entries() if owns(e.info.salt)]
            for key in keys:
                self._remove(key)
        if self._shared is not None:
            self._shared.purge_where(owns)
        return len(keys)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every accepted save is stored (or failed); False on timeout."""
        local = self._writer is None or self._writer.flush(timeout)
        return (self._shared is None or self._shared.flush(timeout)) and local

    def close(self, timeout: float | None = STALL_S) -> None:
        """Refuse new saves, store the queued ones (giving up on a writer that finished
        none for `timeout` s: those are logged and counted as dropped), stop the writer."""
        with self._lock:
            self._closed = True
        lost = self._writer.close(timeout) if self._writer is not None else 0
        with self._lock:  # a stuck writer's saves, logged by it
            self._counts.saves_dropped += lost
            # Its RAM goes back to the process's budget (a deleted model's, or at exit).
            self._drop_ram_copies(self._ram.release())
        if self._shared is not None:  # after the local writer: it queues shared saves
            self._shared.close(timeout)
