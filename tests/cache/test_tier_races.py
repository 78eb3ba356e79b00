"""The index's on_disk flags and the disk tier agree, whatever ran between two critical
sections: a lookup's directory refresh, a save's disk write, another model's eviction.

Each test forces one interleaving with events in wrapped hooks (no sleeps, no luck).
They come from tests/cache/test_writer.py's concurrent test, which failed now and then
under load with "the index is wrong about where it is": a lookup's refresh took the
writer's own file, renamed but not yet counted, for another process's, adopted it and,
over budget, deleted it; the write then counted a file that was gone.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cache.record as record
from cache import CacheBudget, PrefixCache
from cache.disk import DiskTier
from cache.keys import entry_key, seed
from cache.types import Entry
from tests.cache.conftest import MakeCache
from tests.cache.util import config, disk_of, saved, state_for

WAIT_S = 30.0
FILE = record.encoded_size("ns", "", 8, 100)  # the file of an 8-token entry, 100-byte state


def pause_after(
    call: Callable[..., Any],
) -> tuple[Callable[..., Any], threading.Event, threading.Event]:
    """`call` wrapped to signal `done` once it returned, then wait for `go_on`."""
    done, go_on = threading.Event(), threading.Event()

    def paused(*args: Any) -> Any:
        result = call(*args)
        done.set()
        go_on.wait(WAIT_S)
        return result

    return paused, done, go_on


def test_a_lookup_during_our_own_write_neither_adopts_nor_deletes_its_file(
    make_cache: MakeCache,
) -> None:
    cache = make_cache(disk_bytes=FILE)  # one file on disk; RAM holds both
    a, x = [1] * 8, [2] * 8
    saved(cache, a)
    for _ in range(2):  # a's hits make a fresh file the cheapest to evict
        assert cache.lookup(a) is not None
    disk = disk_of(cache)
    assert disk is not None
    disk._write, renamed, write_go_on = pause_after(disk._write)  # type: ignore[method-assign]
    paused, on_disk, store_go_on = pause_after(cache._write_to)
    cache._write_to = paused  # type: ignore[method-assign]
    try:
        assert cache.save(x, state_for(x))
        assert renamed.wait(WAIT_S)  # x's file is in place, the tier does not count it yet
        assert cache.lookup(a) is not None  # its refresh lists x's file
        write_go_on.set()
        assert on_disk.wait(WAIT_S)  # the tier has x; the index hears of it after this
        assert cache.lookup(a) is not None  # the directory changed again: another refresh
    finally:
        write_go_on.set()
        store_go_on.set()
    assert cache.flush(timeout=WAIT_S)
    cache.check_integrity()
    assert os.path.exists(disk._path(key_of(x))) and disk.contains(key_of(x))
    assert cache.stats().disk.entries == 1


def test_a_file_another_replica_wrote_and_our_write_evicted_is_not_indexed(
    make_cache: MakeCache,
) -> None:
    """The refresh lists it as new; before the lookup tells the index, our writer's save
    deletes it to keep the budget: the index must not take it for on disk then."""
    mine = make_cache(disk_bytes=FILE)
    other = make_cache()  # another replica on the same directory
    foreign, y = [3] * 8, [4] * 8
    disk = disk_of(mine)
    assert disk is not None
    disk.refresh, listed, go_on = pause_after(disk.refresh)  # type: ignore[method-assign]
    saved(other, foreign)
    lookup = threading.Thread(target=mine.lookup, args=([9] * 8,))
    lookup.start()
    try:
        assert listed.wait(WAIT_S)  # the refresh counted the foreign file, the index not yet
        assert mine.save(y, state_for(y)) and mine.flush(timeout=WAIT_S)  # evicts it
    finally:
        go_on.set()
    lookup.join(WAIT_S)
    assert not lookup.is_alive()
    mine.check_integrity()
    assert mine.lookup(foreign) is None and mine.lookup(y) is not None


def test_an_entry_another_model_evicts_during_its_write_is_not_on_disk(
    tmp_path: Path,
) -> None:
    """Shared budget: model b's save deletes a's file between a's write and a's index
    update, and a's lookup hears of it first; a's save must not mark it on disk after."""
    size = record.encoded_size("model-a", "", 8, 100)
    budget = CacheBudget(ram_bytes=1 << 20, disk_bytes=size)
    cfg = config(disk_dir=str(tmp_path / "kv"))
    a, b = PrefixCache(cfg, "model-a", budget), PrefixCache(cfg, "model-b", budget)
    x, z = [5] * 8, [6] * 8
    try:
        paused, written, go_on = pause_after(a._write_to)
        a._write_to = paused  # type: ignore[method-assign]
        try:
            assert a.save(x, state_for(x))
            assert written.wait(WAIT_S)  # x's file is counted in the pool, the index not told
            saved(b, z)  # over the one budget: a's x goes
            assert a.lookup([9] * 8) is None  # settles the disk copies b's write took
        finally:
            go_on.set()
        assert a.flush(timeout=WAIT_S)
        for cache in (a, b):
            cache.check_integrity()
        hit = a.lookup(x)
        assert hit is not None and hit.tier == "ram"  # its RAM copy is all that is left
    finally:
        for cache in (a, b):
            cache.close(timeout=WAIT_S)


def test_a_refresh_forgets_no_change_of_our_own_made_while_it_listed(tmp_path: Path) -> None:
    """Our write lands after the refresh's snapshot, and our next write evicts it before
    the refresh counts what it listed: the file it read is gone and stays forgotten."""
    tier = DiskTier(str(tmp_path / "kv"), "ns", FILE)
    x, y = entry([7] * 8), entry([8] * 8)
    tier._write, renamed, write_go_on = pause_after(tier._write)  # type: ignore[method-assign]
    tier._read_info, read, read_go_on = pause_after(tier._read_info)  # type: ignore[method-assign]
    found: list[tuple[list[str], list[str]]] = []

    def refresh() -> None:
        added, gone = tier.refresh()
        found.append(([info.key for info in added], gone))

    put, lister = threading.Thread(target=tier.put, args=(x,)), threading.Thread(target=refresh)
    put.start()
    try:
        assert renamed.wait(WAIT_S)  # x's file is in place, not counted yet
        lister.start()
        assert read.wait(WAIT_S)  # the refresh listed x's file and read its header
        write_go_on.set()
        put.join(WAIT_S)
        assert tier.contains(x.key)
        assert tier.put(y) == [x.key]  # the budget holds one file
    finally:
        write_go_on.set()
        read_go_on.set()
    lister.join(WAIT_S)
    assert found == [([], [])]
    assert not tier.contains(x.key) and tier.contains(y.key) and tier.stats().entries == 1
    assert sorted(os.listdir(tier.dir)) == [y.key + ".kv"]


def entry(tokens: list[int]) -> Entry:
    return Entry(key_of(tokens), "", tuple(tokens), state_for(tokens))


def key_of(tokens: list[int], namespace: str = "ns") -> str:
    return entry_key(seed(namespace, ""), tuple(tokens))
