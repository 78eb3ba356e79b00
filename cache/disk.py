"""The disk tier: one file per entry under `disk_dir/<namespace>/`, within a byte budget
(cache/tier.py: indexed, blocking).

A file is written under a temporary name, fsynced, renamed to `<key>.kv` and the
directory fsynced, so a crash leaves either the whole entry or a temporary file, never a
partial `.kv`. Files are never rewritten in place (a key names its exact tokens). At
start the directory is rescanned from headers only: temporary leftovers and files that
are truncated or of another format, namespace or key are deleted (`corrupt_removed`).
The checksum is verified when an entry is loaded; a failure deletes the file and the
load is a miss. Names that are neither `.kv` nor `.tmp` are not ours and are left alone.

Thread-safe: the lock covers the bookkeeping; reads and writes of file contents happen
outside it (an unlinked file stays readable through a handle already open).

Safe on a directory that several processes (replicas) share: a file appears whole or
not at all (rename), a file evicted by another process is a miss for a reader that had
not opened it yet and stays readable for one that had, and refresh() picks up the files
others wrote when the directory's mtime moves. A temporary file is named after its
writer, so a leftover is told from another replica's write in flight (cache/tmpfiles.py).
Each process keeps the budget over the files it knows of (all of them, once refreshed).
What refresh() lists is older than this process's own bookkeeping of the keys it wrote
or removed meanwhile (a write is renamed into place before it is counted), so it leaves
those keys alone: it would otherwise adopt, evict or forget our own write in flight.
The budget may be the process's (a `Pool` of cache/budget.py that every model's disk
tier counts into, sharing its lock): then a write here may delete another model's file
to keep it, and that tier hands the key to its cache with `take_lost`.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from collections.abc import Collection, Iterator

import cache.record as record
from cache.budget import Pool
from cache.counters import TierIo
from cache.keys import entry_key, seed
from cache.tier import Tier, TierContext
from cache.tmpfiles import TMP_SUFFIX, WRITER, fsync_dir, is_leftover, unlink_quietly
from cache.types import Entry, EntryInfo, TierStats

log = logging.getLogger(__name__)

SUFFIX = ".kv"


class DiskTier(Tier):
    name = "disk"
    indexed = True
    blocking = True

    def __init__(self, root: str, namespace: str, budget: int | Pool) -> None:
        self.dir = os.path.join(root, namespace)
        self._namespace = namespace
        self._pool = pool = budget if isinstance(budget, Pool) else Pool(budget)
        self._lock = pool.lock  # the pool's: a write may evict another tier's file
        self._infos: dict[str, EntryInfo] = {}
        self._policy = pool.share(self._evicted)
        self._lost: list[str] = []  # keys another tier's write evicted (see take_lost)
        self._writing: set[str] = set()  # puts in flight (one writer thread per tier)
        self._refreshes = 0  # refresh() calls between their snapshot and their count
        self._changed: list[str] = []  # keys we added or removed meanwhile (see refresh)
        self._tmp_names = itertools.count()
        self.evictions = 0
        self.corrupt_removed = 0
        self.read_errors = 0
        self._io = TierIo()
        os.makedirs(self.dir, exist_ok=True)  # a bad disk_dir fails at start, loudly
        self._seen_mtime = os.stat(self.dir).st_mtime_ns
        self._scan()
        log.info(
            "cache: disk tier at %s, budget %.1f GiB, %d entries (%.1f MiB) found",
            self.dir,
            self._policy.budget / (1 << 30),
            len(self._infos),
            self._policy.total_bytes / (1 << 20),
        )

    def _path(self, key: str) -> str:
        return os.path.join(self.dir, key + SUFFIX)

    def _scan(self) -> None:
        now = time.time()
        found: list[tuple[float, EntryInfo, int]] = []
        for name in os.listdir(self.dir):
            path = os.path.join(self.dir, name)
            if name.endswith(TMP_SUFFIX):
                with contextlib.suppress(OSError):
                    if is_leftover(name, now - os.stat(path).st_mtime):
                        self._remove_corrupt(path, "leftover temporary file")
            elif name.endswith(SUFFIX):
                item = self._read_info(name)
                if item is not None:
                    found.append(item)
        with self._lock:
            for _, info, size in sorted(found, key=lambda item: item[0]):  # oldest first
                self._track(info, size)
            for key in self._policy.victims():  # the budget may have shrunk since
                self._unlink_tracked(key)
                self.evictions += 1

    def _read_info(self, name: str) -> tuple[float, EntryInfo, int] | None:
        """(mtime, info, size) from a file's header; None if it vanished or is corrupt
        (then removed)."""
        path = os.path.join(self.dir, name)
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                head = record.read_head(f, self._namespace, st.st_size)
            key = name[: -len(SUFFIX)]
            if entry_key(seed(self._namespace, head.salt), head.tokens) != key:
                raise record.CorruptRecord("name does not match contents")
        except FileNotFoundError:  # another process evicted it meanwhile
            return None
        except (OSError, record.CorruptRecord) as e:
            self._remove_corrupt(path, str(e))
            return None
        return st.st_mtime, EntryInfo(key, head.salt, head.tokens), st.st_size

    def changed(self) -> bool:
        """Whether the directory changed since the last refresh (one stat)."""
        try:
            return os.stat(self.dir).st_mtime_ns != self._seen_mtime
        except OSError:
            return False

    def refresh(self) -> tuple[list[EntryInfo], list[str]]:
        """Pick up what other processes did to the directory: (infos of files new to us,
        keys of files gone). Headers are read outside the lock; the budget is enforced
        over everything known afterwards (victims are listed as gone). Keys this process
        wrote or removed since the snapshot are its own business (see the module)."""
        with contextlib.suppress(OSError):
            self._seen_mtime = os.stat(self.dir).st_mtime_ns  # before listing: none missed
        with self._lock:  # before listing: a file our own writer adds meanwhile is not "gone"
            known = set(self._infos)
            self._refreshes += 1
            mark = len(self._changed)
        try:
            names = {n for n in os.listdir(self.dir) if n.endswith(SUFFIX)}
        except OSError as e:
            log.warning("cache: cannot list %s: %s", self.dir, e)
            names = None
        on_disk = {name[: -len(SUFFIX)] for name in names or ()}
        try:
            new = [item for key in on_disk - known if (item := self._read_info(key + SUFFIX))]
        except BaseException:
            with self._lock:
                self._end_refresh(mark)
            raise
        added: list[EntryInfo] = []
        with self._lock:
            ours = self._end_refresh(mark)
            if names is None:
                return [], []
            gone = [key for key in known - on_disk - ours if key in self._infos]
            for key in gone:  # unlinked by another process: forget it, nothing to delete
                self._untrack(key)
            for _, info, size in sorted(new, key=lambda item: item[0]):
                if info.key not in self._infos and info.key not in ours:
                    self._track(info, size)
                    added.append(info)
            victims = self._policy.victims()
            for key in victims:
                self._unlink_tracked(key)
            self.evictions += len(victims)
        return added, gone + victims

    def _end_refresh(self, mark: int) -> set[str]:
        """The keys of ours to leave alone: written now, or changed since `mark`."""
        ours = self._writing.union(self._changed[mark:])
        self._refreshes -= 1
        if not self._refreshes:
            self._changed.clear()
        return ours

    def _remove_corrupt(self, path: str, why: str) -> None:
        log.warning("cache: removing %s (%s)", path, why)
        self.corrupt_removed += 1
        unlink_quietly(path)

    def get(self, key: str) -> Entry | None:
        """The entry, checksum verified; None if absent or unreadable. A corrupt file is
        deleted and counted. Never raises."""
        with self._lock:
            info = self._infos.get(key)
        if info is None:
            return None
        start = time.perf_counter()
        try:
            with open(self._path(key), "rb") as f:
                head = record.read_head(f, self._namespace, os.fstat(f.fileno()).st_size)
                if (head.salt, head.tokens) != (info.salt, info.tokens):
                    raise record.CorruptRecord("contents changed since the scan")
                state = record.read_state(f, head)
        except FileNotFoundError:  # deleted meanwhile (evicted, purged, or by hand)
            self.delete(key)
            return None
        except OSError as e:  # unreadable now (EIO, EMFILE...): a miss, kept for later
            log.warning("cache: cannot read %s: %s", self._path(key), e)
            with self._lock:
                self.read_errors += 1
            return None
        except record.CorruptRecord as e:
            with self._lock:
                if self._untrack(key):
                    self._remove_corrupt(self._path(key), str(e))
            return None
        self._count_io(start, read=len(state))
        self.touch(key)
        return Entry(key, info.salt, info.tokens, state)

    def _count_io(self, start: float, read: int = 0, written: int = 0) -> None:
        with self._lock:
            self._io.add(time.perf_counter() - start, read=read, written=written)

    def fits(self, entry: Entry) -> bool:
        size = record.encoded_size(self._namespace, entry.salt, len(entry.tokens), len(entry.state))
        return self._policy.fits(size)

    def put(self, entry: Entry, protect: Collection[str] = ()) -> list[str]:
        """Write `entry` durably, then delete the least-used files over budget. An OSError
        (disk full, directory gone) propagates with the temporary file removed."""
        with self._lock:  # its file appears before it is counted: refresh() must know
            self._writing.add(entry.key)
        try:
            start = time.perf_counter()
            size = self._write(entry)
            self._count_io(start, written=size)
        except BaseException:
            with self._lock:
                self._writing.discard(entry.key)
            raise
        with self._lock:
            self._writing.discard(entry.key)
            self._track(entry.info, size)
            victims = self._policy.victims({entry.key, *protect})
            for key in victims:
                self._unlink_tracked(key)
            self.evictions += len(victims)
        return victims

    def _write(self, entry: Entry) -> int:
        final = self._path(entry.key)
        tmp = f"{final}.{WRITER}-{next(self._tmp_names)}{TMP_SUFFIX}"
        os.makedirs(self.dir, exist_ok=True)  # recreated if someone removed it
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        size = 0
        try:
            try:
                for piece in record.encode(self._namespace, entry):
                    view = memoryview(piece)
                    while view:
                        written = os.write(fd, view)
                        view = view[written:]
                        size += written
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, final)
        except BaseException:
            unlink_quietly(tmp)
            raise
        try:
            fsync_dir(self.dir)  # makes the rename itself durable
        except BaseException:
            unlink_quietly(final)  # not known durable: not an entry
            raise
        return size

    def contains(self, key: str) -> bool:
        with self._lock:
            return key in self._infos

    def delete(self, key: str) -> bool:
        with self._lock:
            return self._unlink_tracked(key)

    def _track(self, info: EntryInfo, size: int) -> None:
        """Count a file of ours (lock held): every change of `_infos` goes through here
        or `_untrack`, so that a refresh in progress hears of it."""
        self._infos[info.key] = info
        self._policy.add(info.key, size)
        self._note(info.key)

    def _untrack(self, key: str) -> bool:
        """Forget a file (lock held); False if it was not counted."""
        if self._infos.pop(key, None) is None:
            return False
        self._policy.remove(key)
        self._note(key)
        return True

    def _note(self, key: str) -> None:
        if self._refreshes:  # nobody needs the log otherwise
            self._changed.append(key)

    def _unlink_tracked(self, key: str) -> bool:
        if not self._untrack(key):
            return False
        self._unlink_file(key)
        return True

    def _unlink_file(self, key: str) -> None:
        """Delete the entry's file; one already gone is fine, another failure is logged."""
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("cache: cannot delete %s: %s", self._path(key), e)

    def touch(self, key: str) -> None:
        with self._lock:
            self._policy.touch(key)

    def _evicted(self, key: str) -> None:
        """Another tier of the pool took this entry's room (lock held; already uncounted)."""
        if self._untrack(key):
            self._unlink_file(key)
            self.evictions += 1
            self._lost.append(key)

    def take_lost(self) -> list[str]:
        """The keys other tiers' writes evicted since the last call (files gone)."""
        with self._lock:
            lost, self._lost = self._lost, []
            return lost

    def clear(self) -> int:
        # Forget every entry under the lock, then delete the files one lock hold each,
        # so that a purge of thousands of files does not hold up lookups and saves; a
        # key saved again meanwhile (tracked, or being written) keeps its new file.
        with self._lock:
            keys = list(self._infos)
            for key in keys:
                self._untrack(key)
        for key in keys:
            with self._lock:
                if key not in self._infos and key not in self._writing:
                    self._unlink_file(key)
        return len(keys)

    def infos(self) -> Iterator[EntryInfo]:
        with self._lock:
            return iter(list(self._infos.values()))

    def stats(self) -> TierStats:
        with self._lock:
            return self._io.into(
                TierStats(
                    entries=len(self._infos),
                    bytes=self._policy.total_bytes,
                    evictions=self.evictions,
                    errors=self.read_errors,
                    corrupt_removed=self.corrupt_removed,
                )
            )

    def problems(self) -> list[str]:
        over = self._pool.total_bytes > self._pool.budget
        return ["the disk tier is over budget"] if over else []


def open_tier(context: TierContext) -> DiskTier | None:
    """Where `[cache] disk_dir` names a directory; its bytes count in the process's pool."""
    path = context.config.disk_path
    return DiskTier(path, context.namespace, context.budget.disk) if path else None
