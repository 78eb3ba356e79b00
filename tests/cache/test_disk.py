"""The disk tier: write-through, promotion, restart, corrupt files, budget, write errors."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from cache import record
from cache.keys import entry_key, seed
from cache.types import Entry
from tests.cache.conftest import MakeCache
from tests.cache.util import saved, state_for

A, B, C, D = ([i, i, i, i, 1, 2, 3, 4, 5] for i in range(4))
ENTRY = 100 + 4 * 9  # RAM bytes of one entry with a 100-byte state


def kv_files(tmp_path: Path, namespace: str = "ns") -> list[str]:
    return sorted(os.listdir(tmp_path / "kv" / namespace))


def test_ram_eviction_keeps_the_disk_copy_and_promotes_it_back(make_cache: MakeCache) -> None:
    cache = make_cache(ram_bytes=ENTRY)
    saved(cache, A, B)
    stats = cache.stats()
    assert (stats.ram.entries, stats.ram.evictions, stats.disk.entries) == (1, 1, 2)
    first = cache.lookup(A)
    assert first is not None and first.tier == "disk" and first.state == state_for(A)
    again = cache.lookup(A)
    assert again is not None and again.tier == "ram"  # promoted, B evicted in turn
    stats = cache.stats()
    assert (stats.disk.hits, stats.ram.hits, stats.ram.misses) == (1, 1, 1)


def test_without_a_disk_tier_ram_eviction_forgets(make_cache: MakeCache) -> None:
    cache = make_cache(ram_bytes=ENTRY, disk_dir="")
    saved(cache, A, B)
    assert cache.lookup(A) is None
    assert cache.lookup(B) is not None


def test_disk_only_when_ram_budget_is_zero(make_cache: MakeCache) -> None:
    cache = make_cache(ram_bytes=0)
    saved(cache, A)
    hit = cache.lookup(A)
    assert hit is not None and hit.tier == "disk"
    assert cache.stats().ram.entries == 0


def test_restart_finds_entries_on_disk(make_cache: MakeCache, tmp_path: Path) -> None:
    first = make_cache()
    saved(first, A, B, salt="t")
    first.close()
    restarted = make_cache()
    assert restarted.stats().disk.entries == 2
    assert restarted.lookup(A) is None  # the salt is stored with the entry
    hit = restarted.lookup([*B, 6, 7], salt="t")
    assert hit is not None and hit.tier == "disk" and hit.state == state_for(B)
    assert hit.num_matched == len(B)
    assert restarted.stats().corrupt_removed == 0


def write_record(path: Path, namespace: str, tokens: list[int], salt: str = "") -> None:
    entry = Entry(entry_key(seed(namespace, salt), tokens), salt, tuple(tokens), state_for(tokens))
    path.write_bytes(b"".join(bytes(p) for p in record.encode(namespace, entry)))


def dead_pid() -> int:
    """The pid of a process that has exited (a fixed number may be a live process here)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_bad_files_are_removed_at_scan_and_never_returned(
    make_cache: MakeCache, tmp_path: Path
) -> None:
    saved(make_cache(), A, B, C)
    names = {tuple(t): entry_key(seed("ns", ""), t) + ".kv" for t in (A, B, C)}
    ns_dir = tmp_path / "kv" / "ns"
    truncated = ns_dir / names[tuple(A)]
    truncated.write_bytes(truncated.read_bytes()[:-10])
    versioned = ns_dir / names[tuple(B)]
    data = bytearray(versioned.read_bytes())
    data[8] = 99  # the format version
    versioned.write_bytes(bytes(data))
    write_record(ns_dir / (entry_key(seed("other", ""), D) + ".kv"), "other", D)  # foreign
    write_record(ns_dir / "0123.kv", "ns", D)  # valid record under the wrong name
    (ns_dir / (names[tuple(C)] + f".{dead_pid()}-0.tmp")).write_bytes(b"half a write")
    (ns_dir / "notes.txt").write_text("not ours")

    cache = make_cache()
    assert cache.stats().corrupt_removed == 5
    assert kv_files(tmp_path) == sorted([names[tuple(C)], "notes.txt"])
    assert cache.lookup(A) is None and cache.lookup(B) is None and cache.lookup(D) is None
    assert cache.lookup(C) is not None


def test_bit_flip_is_a_miss_at_load(make_cache: MakeCache, tmp_path: Path) -> None:
    saved(make_cache(), A)
    path = tmp_path / "kv" / "ns" / (entry_key(seed("ns", ""), A) + ".kv")
    data = bytearray(path.read_bytes())
    data[-40] ^= 0x10  # inside the state: the header scan cannot see it
    path.write_bytes(bytes(data))

    cache = make_cache()
    assert cache.stats().disk.entries == 1  # passed the cheap scan
    assert cache.lookup(A) is None
    stats = cache.stats()
    assert (stats.corrupt_removed, stats.disk.entries, stats.disk.misses) == (1, 0, 1)
    assert not path.exists()
    assert cache.lookup(A) is None  # forgotten, not retried


def test_disk_budget_deletes_the_least_used_files(make_cache: MakeCache, tmp_path: Path) -> None:
    file_size = record.encoded_size("ns", "", len(A), 100)
    cache = make_cache(disk_bytes=2 * file_size, ram_bytes=0)
    saved(cache, A, B)
    assert cache.lookup(A) is not None  # A is now used more recently than B
    saved(cache, C)
    stats = cache.stats()
    assert (stats.disk.entries, stats.disk.bytes, stats.disk.evictions) == (2, 2 * file_size, 1)
    assert cache.lookup(B) is None and cache.lookup(A) is not None
    assert len(kv_files(tmp_path)) == 2
    smaller = make_cache(disk_bytes=file_size, ram_bytes=0)  # a restart with less room
    assert smaller.stats().disk.entries == 1 and len(kv_files(tmp_path)) == 1


def fail_once(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The writer thread's next os.<name> call fails as on a full disk."""
    real = getattr(os, name)
    failed = threading.Event()

    def failing(*args: Any) -> Any:
        if threading.current_thread().name == "kv-cache-writer" and not failed.is_set():
            failed.set()
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args)

    monkeypatch.setattr(os, name, failing)


@pytest.mark.parametrize("failure", ["write", "fsync", "directory"])
def test_a_write_error_fails_only_that_save(
    make_cache: MakeCache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    cache = make_cache()
    ns_dir = tmp_path / "kv" / "ns"
    if failure == "directory":
        ns_dir.rmdir()
        ns_dir.write_text("a file where the directory was")
    else:
        fail_once(monkeypatch, failure)
    saved(cache, A)
    stats = cache.stats()
    assert (stats.save_errors, stats.saves, stats.disk.entries) == (1, 1, 0)
    assert stats.disk.errors == 1  # the per-tier view counts the failed write too
    hit = cache.lookup(A)
    assert hit is not None and hit.tier == "ram"  # the RAM copy still serves
    if failure == "directory":
        ns_dir.unlink()
    else:
        assert kv_files(tmp_path) == []  # no temporary file left behind
    saved(cache, B)  # the cache goes on working
    assert cache.stats().disk.entries == 1 and cache.stats().save_errors == 1
    assert len(kv_files(tmp_path)) == 1


def test_equal_matches_prefer_the_entry_in_ram(make_cache: MakeCache) -> None:
    x, y = [*range(8), 50, 51, 52, 53], [*range(8), 60, 61, 62, 63]
    cache = make_cache(ram_bytes=100 + 4 * 12)  # one entry
    saved(cache, y, x)  # x is the newer entry, and now the one in RAM
    assert cache.lookup(y) is not None  # promotes y, evicting x from RAM
    hit = cache.lookup([*range(8), 70, 71, 72, 73])  # 8 tokens common with either
    assert hit is not None and hit.num_matched == 8
    assert hit.tier == "ram" and hit.tokens == tuple(y)


def test_an_unreadable_file_is_a_miss_not_an_error(
    make_cache: MakeCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = make_cache(ram_bytes=0)
    saved(cache, A)
    real_open = open

    def failing_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path).endswith(".kv"):
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", failing_open)
    assert cache.lookup(A) is None  # transient: the file is kept
    monkeypatch.undo()
    hit = cache.lookup(A)
    assert hit is not None and hit.state == state_for(A)
    assert cache.stats().corrupt_removed == 0


def test_a_save_landing_during_a_clear_keeps_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """clear() forgets the entries, then deletes their files: a save of the same key
    between the two kept its index entry while clear() deleted the new file under it."""
    from cache.disk import DiskTier

    tier = DiskTier(str(tmp_path / "kv"), "ns", 10 << 20)
    tokens = list(range(40))
    entry = Entry(entry_key(seed("ns", ""), tokens), "", tuple(tokens), state_for(tokens))
    tier.put(entry)
    unlink = os.unlink
    saver: list[threading.Thread] = []

    def unlink_after_a_save(path: Any, *args: Any, **kwargs: Any) -> None:
        if not saver and str(path).endswith(".kv"):  # clear() deletes: a save lands now
            saver.append(threading.Thread(target=tier.put, args=(entry,)))
            saver[0].start()
            saver[0].join(0.5)  # done at once unless clear() holds the tier's lock
        unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink_after_a_save)
    assert tier.clear() == 1
    saver[0].join()
    monkeypatch.setattr(os, "unlink", unlink)
    assert tier.contains(entry.key)
    got = tier.get(entry.key)  # listed, so its file is there
    assert got is not None and got.tokens == entry.tokens
