"""The shared tier on a real redis-server: what one replica stores another finds, with
the local tiers' guarantees, and a store that is down or slow is a counted miss."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from cache import PrefixCache, recording_calls
from cache.keys import entry_key, seed
from tests.cache.util import config, saved, state_for
from tests.helpers.redis_process import Redis, running_redis

PROMPT = [7, 7, 7, 7, 1, 2, 3, 4, 5, 6, 7, 8, 9]  # three full blocks of 4, and one token
ASK = [*PROMPT, 10, 11, 12]  # the next turn: extends it


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Redis]:
    with running_redis(tmp_path) as server:
        yield server


@pytest.fixture
def replicas(tmp_path: Path, store: Redis) -> Iterator[list[PrefixCache]]:
    """Two caches, as two replicas: each its own RAM and disk, one shared store."""
    caches = [
        PrefixCache(
            config(disk_dir=str(tmp_path / f"disk{i}"), shared_url=store.url, shared_retry_s=0.5),
            "ns",
        )
        for i in range(2)
    ]
    yield caches
    for cache in caches:
        cache.close(timeout=30)


@pytest.fixture
def seeded(replicas: list[PrefixCache]) -> list[PrefixCache]:
    """The replicas once the first has saved PROMPT (and it reached the store)."""
    saved(replicas[0], PROMPT)
    return replicas


@contextlib.contextmanager
def replica(store: Redis, namespace: str = "ns") -> Iterator[PrefixCache]:
    """One more replica, on the shared store and RAM alone, closed after."""
    cache = PrefixCache(config(disk_dir="", shared_url=store.url), namespace)
    try:
        yield cache
    finally:
        cache.close(timeout=10)


def test_what_one_replica_saves_the_other_finds(seeded: list[PrefixCache]) -> None:
    one, two = seeded
    assert two.lookup(ASK) is not None
    hit = two.lookup(ASK)  # the first hit was promoted to RAM
    assert hit is not None and hit.tier == "ram"
    stats = two.stats()
    assert stats.shared is not None
    # RAM served 13 of the 16 tokens' 4 full blocks: the shared tier was asked for more
    assert (stats.shared.hits, stats.shared.misses, stats.shared.errors) == (1, 1, 0)
    assert stats.shared.bytes_read == len(state_for(PROMPT))
    assert one.stats().shared.bytes_written > len(state_for(PROMPT))  # type: ignore[union-attr]


def test_a_shared_hit_carries_the_exact_state(seeded: list[PrefixCache]) -> None:
    one, two = seeded
    hit = two.lookup(ASK)
    assert hit is not None and hit.tier == "shared"
    assert (hit.tokens, hit.num_matched, hit.state) == (tuple(PROMPT), len(PROMPT), state_for(PROMPT))


def test_a_lookup_records_its_store_calls_for_traces(
    seeded: list[PrefixCache], store: Redis
) -> None:
    """Inside `recording_calls` a lookup notes each call to the store (the request's
    trace makes them spans); saves, on the writer thread, and calls outside are not."""
    one, two = seeded
    assert two.lookup([8, 8, 8, 8, 8]) is None  # not recorded
    with recording_calls() as calls:
        hit = two.lookup(ASK)
        saved(two, [4, 4, 4, 4, 4])  # its store put runs on the writer thread
    assert hit is not None and hit.tier == "shared"
    assert [c.operation for c in calls] == ["find", "get", "touch"]
    assert all((c.address, c.port, c.error) == ("127.0.0.1", store.port, None) for c in calls)
    assert all(c.start <= c.end for c in calls)
    assert calls[0].end <= calls[1].start <= calls[1].end <= calls[2].start
    store.stop()
    with recording_calls() as calls:
        assert one.lookup([6, 6, 6, 6, 6]) is None
    (failed,) = calls
    assert failed.operation == "find" and failed.error and "Connection" in failed.error


def test_a_partial_prefix_is_found_at_its_deepest_block(seeded: list[PrefixCache]) -> None:
    one, two = seeded
    diverging = [*PROMPT[:9], 99, 98, 97, 96]  # shares two blocks and one token
    hit = two.lookup(diverging)
    assert hit is not None and hit.tier == "shared" and hit.num_matched == 9


def test_a_longer_shared_entry_beats_a_shorter_local_one(replicas: list[PrefixCache]) -> None:
    one, two = replicas
    saved(two, PROMPT[:8])  # replica two knows the head only
    saved(one, PROMPT)
    hit = two.lookup(ASK)
    assert hit is not None and hit.tier == "shared" and hit.num_matched == len(PROMPT)


def test_salts_and_namespaces_stay_apart(tmp_path: Path, store: Redis) -> None:
    with replica(store) as writer, replica(store, "other") as other_ns:
        saved(writer, PROMPT, salt="tenant-a")
        with replica(store) as reader:
            assert reader.lookup(ASK, salt="tenant-b") is None
            assert reader.lookup(ASK) is None
            assert other_ns.lookup(ASK, salt="tenant-a") is None
            assert reader.lookup(ASK, salt="tenant-a") is not None


def test_a_corrupt_or_foreign_value_is_a_counted_miss_and_removed(
    seeded: list[PrefixCache], store: Redis
) -> None:
    one, two = seeded
    client = redis.Redis.from_url(store.url)
    name = f"kvserve:ns:e:{entry_key(seed('ns', ''), PROMPT)}:"  # the salt "" in hex
    value = client.get(name)
    assert isinstance(value, bytes)
    flipped = bytearray(value)
    flipped[len(flipped) // 2] ^= 0x01  # one bit of the state
    client.set(name, bytes(flipped))
    assert two.lookup(ASK) is None
    assert client.exists(name) == 0  # deleted, never loaded
    stats = two.stats()
    assert stats.corrupt_removed == 1 and stats.shared is not None and stats.shared.misses == 1
    # an entry of another namespace under this one's key: its header says so
    saved(one, PROMPT)
    with replica(store, "zz") as foreign:
        saved(foreign, PROMPT)
        other = client.get(f"kvserve:zz:e:{entry_key(seed('zz', ''), PROMPT)}:")
        assert isinstance(other, bytes)
        client.set(name, other)
        with replica(store) as three:
            assert three.lookup(ASK) is None and three.stats().corrupt_removed == 1
    client.close()


def test_a_stopped_store_is_a_counted_miss_then_hits_resume(
    seeded: list[PrefixCache], store: Redis
) -> None:
    one, two = seeded
    store.stop()
    start = time.monotonic()
    assert two.lookup(ASK) is None  # connection refused: at once
    assert one.save([5, 5, 5, 5, 6], state_for([5, 5, 5, 5, 6]))  # local save still taken
    assert one.flush(timeout=10)
    assert time.monotonic() - start < 5
    errors = two.stats().shared.errors  # type: ignore[union-attr]
    assert errors >= 1
    store.start()  # empty again (no persistence): store, then find
    time.sleep(0.6)  # past shared_retry_s
    saved(one, [1, 1, 1, 1, 2, 2, 2, 2])
    hit = two.lookup([1, 1, 1, 1, 2, 2, 2, 2, 3])
    assert hit is not None and hit.tier == "shared"


def test_a_store_that_never_answers_costs_one_timeout_not_a_stall(tmp_path: Path) -> None:
    """A listener that accepts and never replies: every call would hang without the
    socket timeout; the pause after the first error makes the next lookups free."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        silent.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(silent.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
    cache = PrefixCache(
        config(disk_dir="", shared_url=url, shared_timeout_s=0.3, shared_retry_s=30), "ns"
    )
    try:
        start = time.monotonic()
        assert cache.lookup(ASK) is None
        first = time.monotonic() - start
        assert first < 2.0
        start = time.monotonic()
        for _ in range(20):
            assert cache.lookup(ASK) is None
        assert time.monotonic() - start < 0.5  # in the pause: not asked at all
        assert cache.save(PROMPT, state_for(PROMPT))  # RAM takes it
        assert cache.flush(timeout=5)
        shared = cache.stats().shared
        assert shared is not None and shared.errors == 1 and shared.misses == 21
        assert cache.stats().saves_dropped == 1  # the shared copy, in the pause
    finally:
        cache.close(timeout=5)
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        silent.close()


def test_purge_drops_the_shared_entries_of_its_namespace_only(
    seeded: list[PrefixCache], store: Redis
) -> None:
    one, two = seeded
    with replica(store, "other") as other:
        saved(other, PROMPT)
        one.purge()
        assert two.lookup(ASK) is None
        with replica(store, "other") as fresh:
            assert fresh.lookup(ASK) is not None


def test_a_tenant_purge_reaches_the_shared_tier(
    replicas: list[PrefixCache], store: Redis
) -> None:
    """Issue 17, item 9: a tenant's purge removes its entries from the shared store too,
    so no replica finds them again there (and puts them back into its RAM)."""
    one, two = replicas
    saved(one, PROMPT, salt="t1/x")
    saved(one, PROMPT, salt="t2")
    assert two.lookup(ASK, salt="t1/x") is not None  # now in two's RAM as well
    assert two.purge_where(lambda salt: salt == "t1" or salt.startswith("t1/")) == 1
    assert two.lookup(ASK, salt="t1/x") is None
    assert one.purge_where(lambda salt: salt.startswith("t1/")) == 1  # its own local copy
    with replica(store) as fresh:
        assert fresh.lookup(ASK, salt="t1/x") is None
        hit = fresh.lookup(ASK, salt="t2")  # another tenant's stays
        assert hit is not None and hit.tier == "shared"


def test_a_hit_renews_the_pointers_that_lead_to_the_entry(
    seeded: list[PrefixCache], store: Redis
) -> None:
    """Issue 17, item 9: a hot entry stays reachable; renewing the entry alone would
    leave its block pointers to expire under it."""
    one, two = seeded
    client = redis.Redis.from_url(store.url)
    try:
        names = list(client.scan_iter(match="kvserve:ns:*"))
        assert len(names) == 1 + len(PROMPT) // 4  # the entry and its 3 block pointers
        for name in names:
            client.pexpire(name, 1000)  # about to expire
        assert two.lookup(ASK) is not None
        assert all(client.pttl(name) > 60_000 for name in names)  # renewed: the TTL again
    finally:
        client.close()


def test_close_stores_the_queued_saves_before_letting_go(tmp_path: Path, store: Redis) -> None:
    """Drain: what the engine saves at shutdown reaches the shared tier before exit."""
    leaving = PrefixCache(config(disk_dir="", shared_url=store.url), "ns")
    prompts = [[i, i, i, i, 1, 2, 3, 4] for i in range(8)]
    for tokens in prompts:
        assert leaving.save(tokens, state_for(tokens))
    leaving.close(timeout=30)  # no flush() first
    with replica(store) as other:
        for tokens in prompts:
            hit = other.lookup(tokens)
            assert hit is not None and hit.tier == "shared" and hit.state == state_for(tokens)
