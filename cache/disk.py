"""The disk tier: one file per entry under `disk_dir/<namespace>/`, within a byte budget.

A file is written under a temporary name, fsynced, renamed to `<key>.kv` and the
directory fsynced, so a crash leaves either the whole entry or a temporary file, never a
partial `.kv`. Files are never rewritten in place (a key names its exact tokens). At
start the directory is rescanned from headers only: temporary leftovers and files that
are truncated or of another format, namespace or key are deleted (`corrupt_removed`).
The checksum is verified when an entry is loaded; a failure deletes the file and the
load is a miss. Names that are neither `.kv` nor `.tmp` are not ours and are left alone.

Thread-safe: the lock covers the bookkeeping; reads and writes of file contents happen
outside it (an unlinked file stays readable through a handle already open).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
from collections.abc import Collection, Iterator

from cache import record
from cache.keys import entry_key, seed
from cache.policy import UsagePolicy
from cache.types import Entry, EntryInfo, TierStats

log = logging.getLogger(__name__)

SUFFIX = ".kv"
TMP_SUFFIX = ".tmp"


class DiskTier:
    name = "disk"

    def __init__(self, root: str, namespace: str, budget: int) -> None:
        self.dir = os.path.join(root, namespace)
        self._namespace = namespace
        self._lock = threading.Lock()
        self._infos: dict[str, EntryInfo] = {}
        self._policy = UsagePolicy(budget)
        self._tmp_names = itertools.count()
        self.evictions = 0
        self.corrupt_removed = 0
        os.makedirs(self.dir, exist_ok=True)  # a bad disk_dir fails at start, loudly
        self._scan()
        log.info(
            "cache: disk tier at %s, budget %.1f GiB, %d entries (%.1f MiB) found",
            self.dir,
            budget / (1 << 30),
            len(self._infos),
            self._policy.total_bytes / (1 << 20),
        )

    def _path(self, key: str) -> str:
        return os.path.join(self.dir, key + SUFFIX)

    def _scan(self) -> None:
        found: list[tuple[float, EntryInfo, int]] = []
        for name in os.listdir(self.dir):
            path = os.path.join(self.dir, name)
            if name.endswith(TMP_SUFFIX):
                self._remove_corrupt(path, "leftover temporary file")
            elif name.endswith(SUFFIX):
                try:
                    with open(path, "rb") as f:
                        st = os.fstat(f.fileno())
                        head = record.read_head(f, self._namespace, st.st_size)
                    key = name[: -len(SUFFIX)]
                    if entry_key(seed(self._namespace, head.salt), head.tokens) != key:
                        raise record.CorruptRecord("name does not match contents")
                except (OSError, record.CorruptRecord) as e:
                    self._remove_corrupt(path, str(e))
                    continue
                found.append((st.st_mtime, EntryInfo(key, head.salt, head.tokens), st.st_size))
        for _, info, size in sorted(found, key=lambda item: item[0]):  # oldest least recent
            self._infos[info.key] = info
            self._policy.add(info.key, size)
        for key in self._policy.victims():  # the budget may have shrunk since
            self._unlink_tracked(key)
            self.evictions += 1

    def _remove_corrupt(self, path: str, why: str) -> None:
        log.warning("cache: removing %s (%s)", path, why)
        self.corrupt_removed += 1
        _unlink_quietly(path)

    def get(self, key: str) -> Entry | None:
        """The entry, checksum verified; None if absent or unreadable. A corrupt file is
        deleted and counted. Never raises."""
        with self._lock:
            info = self._infos.get(key)
        if info is None:
            return None
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
            return None
        except record.CorruptRecord as e:
            with self._lock:
                if self._infos.pop(key, None) is not None:
                    self._policy.remove(key)
                    self._remove_corrupt(self._path(key), str(e))
            return None
        self.touch(key)
        return Entry(key, info.salt, info.tokens, state)

    def fits(self, entry: Entry) -> bool:
        size = record.encoded_size(self._namespace, entry.salt, len(entry.tokens), len(entry.state))
        return self._policy.fits(size)

    def put(self, entry: Entry, protect: Collection[str] = ()) -> list[str]:
        """Write `entry` durably, then delete the least-used files over budget. An OSError
        (disk full, directory gone) propagates with the temporary file removed."""
        size = self._write(entry)
        with self._lock:
            self._infos[entry.key] = entry.info
            self._policy.add(entry.key, size)
            victims = self._policy.victims({entry.key, *protect})
            for key in victims:
                self._unlink_tracked(key)
            self.evictions += len(victims)
        return victims

    def _write(self, entry: Entry) -> int:
        final = self._path(entry.key)
        tmp = f"{final}.{os.getpid()}-{next(self._tmp_names)}{TMP_SUFFIX}"
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
            _unlink_quietly(tmp)
            raise
        try:
            _fsync_dir(self.dir)  # makes the rename itself durable
        except BaseException:
            _unlink_quietly(final)  # not known durable: not an entry
            raise
        return size

    def contains(self, key: str) -> bool:
        with self._lock:
            return key in self._infos

    def delete(self, key: str) -> bool:
        with self._lock:
            return self._unlink_tracked(key)

    def _unlink_tracked(self, key: str) -> bool:
        if self._infos.pop(key, None) is None:
            return False
        self._policy.remove(key)
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("cache: cannot delete %s: %s", self._path(key), e)
        return True

    def touch(self, key: str) -> None:
        with self._lock:
            self._policy.touch(key)

    def clear(self) -> int:
        with self._lock:
            keys = list(self._infos)
            for key in keys:
                self._unlink_tracked(key)
        return len(keys)

    def infos(self) -> Iterator[EntryInfo]:
        with self._lock:
            return iter(list(self._infos.values()))

    def stats(self) -> TierStats:
        with self._lock:
            return TierStats(
                entries=len(self._infos),
                bytes=self._policy.total_bytes,
                evictions=self.evictions,
            )


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
