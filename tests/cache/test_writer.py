"""The writer thread: saves never block, a saturated queue drops and counts, threads."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cache import PrefixCache
from tests.cache.conftest import MakeCache
from tests.cache.util import disk_of, saved, state_for

BlockWriter = Callable[[PrefixCache], tuple[threading.Event, threading.Event]]


@pytest.fixture
def block_writer(make_cache: MakeCache) -> Iterator[BlockWriter]:
    """Make a cache's writer stop inside its next save until `release` is set (at the
    latest when the test ends, so a failing test does not leave the writer stuck)."""
    releases: list[threading.Event] = []

    def block(cache: PrefixCache) -> tuple[threading.Event, threading.Event]:
        entered, release = threading.Event(), threading.Event()
        releases.append(release)
        writer = cache._writer
        assert writer is not None
        store = writer._run

        def blocked(job: Any) -> None:
            entered.set()
            release.wait()
            store(job)

        writer._run = blocked
        return entered, release

    yield block
    for release in releases:
        release.set()


def test_a_saturated_writer_drops_and_counts_without_blocking(
    make_cache: MakeCache, block_writer: BlockWriter
) -> None:
    cache = make_cache(writer_queue=2)
    entered, release = block_writer(cache)
    lists = [[i] * 8 for i in range(5)]
    assert cache.save(lists[0], state_for(lists[0]))
    assert entered.wait(timeout=30)  # the writer holds the first save
    assert cache.save(lists[1], state_for(lists[1]))
    assert cache.save(lists[2], state_for(lists[2]))  # the queue (2) is now full

    results: list[bool] = []
    saver = threading.Thread(
        target=lambda: results.extend(cache.save(t, state_for(t)) for t in lists[3:])
    )
    saver.start()
    saver.join(timeout=30)
    assert not saver.is_alive() and results == [False, False]
    assert not cache.flush(timeout=0.01)  # still held
    assert cache.stats().saves_dropped == 2

    release.set()
    assert cache.flush(timeout=30)
    stats = cache.stats()
    assert (stats.saves, stats.saves_dropped, stats.disk.entries) == (3, 2, 3)
    assert cache.lookup(lists[3]) is None and cache.lookup(lists[2]) is not None


def test_saves_queued_before_a_purge_do_not_land_after_it(
    make_cache: MakeCache, block_writer: BlockWriter
) -> None:
    cache = make_cache()
    entered, release = block_writer(cache)
    first, second = [1] * 8, [2] * 8
    cache.save(first, state_for(first))
    assert entered.wait(timeout=30)
    cache.save(second, state_for(second))
    cache.purge()
    release.set()
    assert cache.flush(timeout=30)
    assert cache.lookup(first) is None and cache.lookup(second) is None
    assert cache.stats().disk.entries == 0 and cache.stats().saves == 0


def test_close_flushes_then_refuses_saves(make_cache: MakeCache) -> None:
    cache = make_cache()
    tokens = [3] * 8
    assert cache.save(tokens, state_for(tokens))
    cache.close(timeout=30)
    assert cache.stats().saves == 1 and cache.stats().disk.entries == 1
    assert not cache.save([4] * 8, state_for([4] * 8))
    cache.close()  # idempotent


def test_concurrent_lookups_and_saves_return_only_true_states(make_cache: MakeCache) -> None:
    # Small budgets so evictions, promotions and replacements all happen under load.
    ram_bytes, disk_bytes = 3 * 1100, 8 * 1200
    cache = make_cache(ram_bytes=ram_bytes, disk_bytes=disk_bytes, writer_queue=64)
    heads = [[h] * 4 + [h + 1] * 4 for h in range(6)]
    for head in heads:
        assert cache.save(head, state_for(head, 1000))
    assert cache.flush(timeout=60)
    errors: list[str] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for i in range(400):
            tokens = rng.choice(heads) + [rng.randrange(3) for _ in range(rng.randrange(12))]
            if i % 3 == 0:
                cache.save(tokens, state_for(tokens, 1000))
                continue
            hit = cache.lookup(tokens)
            if hit is None:
                continue
            n = hit.num_matched
            ok = (
                hit.state == state_for(hit.tokens, 1000)
                and list(hit.tokens[:n]) == tokens[:n]
                and (n in (len(tokens), len(hit.tokens)) or hit.tokens[n] != tokens[n])
            )
            if not ok:
                errors.append(f"{tokens} -> {hit.tokens} n={n}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert cache.flush(timeout=60)
    assert errors == []
    cache.check_integrity()
    stats = cache.stats()
    assert stats.ram.hits + stats.disk.hits > 0 and stats.saves > 0
    assert stats.save_errors == 0 and stats.corrupt_removed == 0


def test_check_integrity_notices_a_lost_file(make_cache: MakeCache) -> None:
    cache = make_cache()
    saved(cache, [1] * 8)
    cache.check_integrity()
    assert disk_of(cache) is not None
    disk_of(cache).clear()  # behind the index's back
    with pytest.raises(RuntimeError, match="wrong about where"):
        cache.check_integrity()


def test_an_entry_is_not_evicted_from_ram_before_it_is_on_disk(make_cache: MakeCache) -> None:
    a, b = [1] * 8, [2] * 8
    cache = make_cache(ram_bytes=100 + 4 * 8)  # one entry
    saved(cache, a)
    disk = disk_of(cache)
    assert disk is not None
    entered, release = threading.Event(), threading.Event()
    write = disk._write

    def slow_write(entry: Any) -> int:
        entered.set()
        release.wait()
        return write(entry)

    disk._write = slow_write  # type: ignore[method-assign]
    assert cache.save(b, state_for(b))
    try:
        assert entered.wait(timeout=30)  # b is in RAM only, its file not written yet
        promoted = cache.lookup(a)  # a disk hit whose promotion needs b's room
        assert promoted is not None and promoted.tier == "disk"
        pending = cache.lookup(b)
        assert pending is not None and pending.tier == "ram"
    finally:
        release.set()
    assert cache.flush(timeout=30)
    cache.check_integrity()  # back within budget, b on disk
    assert cache.stats().disk.entries == 2 and cache.stats().ram.entries == 1


def test_a_drain_save_waits_for_room_and_is_stored(
    make_cache: MakeCache, block_writer: BlockWriter
) -> None:
    """Shutdown and unload save every resident slot (the README's promise): their saves
    wait for the 1-deep queue instead of being dropped."""
    cache = make_cache(writer_queue=1)
    entered, release = block_writer(cache)
    lists = [[i] * 8 for i in range(4)]
    assert cache.save(lists[0], state_for(lists[0]), wait=True)
    assert entered.wait(timeout=30)  # the writer holds the first; the queue is empty
    assert cache.save(lists[1], state_for(lists[1]), wait=True)  # fills the queue
    results: list[bool] = []
    saver = threading.Thread(
        target=lambda: results.extend(cache.save(t, state_for(t), wait=True) for t in lists[2:])
    )
    saver.start()
    saver.join(timeout=0.3)
    assert saver.is_alive()  # waiting for room, not dropped
    release.set()
    saver.join(timeout=30)
    assert results == [True, True]
    cache.close(timeout=30)
    stats = cache.stats()
    assert (stats.saves, stats.saves_dropped, stats.disk.entries) == (4, 0, 4)


def test_a_drain_gives_up_on_a_stuck_writer_and_counts_what_it_lost(
    make_cache: MakeCache, block_writer: BlockWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("cache.writer.STALL_S", 0.2)
    cache = make_cache(writer_queue=1)
    entered, _ = block_writer(cache)  # stuck until the test ends (a dead disk)
    lists = [[i] * 8 for i in range(3)]
    assert cache.save(lists[0], state_for(lists[0]), wait=True)
    assert entered.wait(timeout=30)
    assert cache.save(lists[1], state_for(lists[1]), wait=True)
    assert not cache.save(lists[2], state_for(lists[2]), wait=True)  # no progress: given up
    started = time.monotonic()
    cache.close(timeout=0.2)
    assert time.monotonic() - started < 5
    # The one refused, and the two the writer never stored.
    assert cache.stats().saves_dropped == 3
