"""One disk directory shared by several processes (a volume mounted into every replica):
a replica sees what another wrote, and one's eviction never corrupts another's read."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from cache import PrefixCache
from cache.tmpfiles import HOST as _HOST
from cache.tmpfiles import TMP_MAX_AGE_S
from cache.tmpfiles import is_leftover as _is_leftover
from tests.cache.conftest import MakeCache
from tests.cache.util import config, saved, state_for

PROMPT = [3, 3, 3, 3, 1, 2, 3, 4, 5]


def test_a_replica_finds_what_another_wrote_after_it_started(make_cache: MakeCache) -> None:
    one, two = make_cache(ram_bytes=0), make_cache(ram_bytes=0)  # one directory
    assert two.lookup(PROMPT) is None
    saved(one, PROMPT)
    hit = two.lookup([*PROMPT, 6, 7])
    assert hit is not None and hit.tier == "disk" and hit.state == state_for(PROMPT)
    assert two.stats().disk.entries == 1
    two.check_integrity()


def test_an_entry_another_replica_removed_is_a_clean_miss(make_cache: MakeCache) -> None:
    one, two = make_cache(ram_bytes=0), make_cache(ram_bytes=0)
    saved(one, PROMPT)
    assert two.lookup(PROMPT) is not None
    one.purge()  # unlinks the file under two's index
    assert two.lookup(PROMPT) is None
    stats = two.stats()
    assert (stats.disk.entries, stats.corrupt_removed) == (0, 0)
    two.check_integrity()


def test_eviction_by_one_never_corrupts_a_read_by_another(tmp_path: Path) -> None:
    """One replica writes under a budget of three entries (so it evicts all along) while
    another reads the same directory: every hit is exactly its entry's state, nothing
    is ever counted corrupt, and nothing raises."""
    size = 20_000
    entry_bytes = size + 200
    cfg = config(disk_dir=str(tmp_path / "kv"), ram_bytes=0, disk_bytes=3 * entry_bytes)
    writer, reader = PrefixCache(cfg, "ns"), PrefixCache(cfg, "ns")
    prompts = [[i, i, i, i, 9, 9, 9, 9] for i in range(40)]
    done = threading.Event()
    problems: list[str] = []
    hits = 0

    def read() -> None:
        nonlocal hits
        while not done.is_set():
            for tokens in prompts:
                try:
                    hit = reader.lookup(tokens)
                except Exception as e:  # noqa: BLE001 - the test is that nothing raises
                    problems.append(repr(e))
                    return
                if hit is not None:
                    hits += 1
                    if hit.state != state_for(tokens, size):
                        problems.append(f"wrong state for {tokens[0]}")

    thread = threading.Thread(target=read)
    thread.start()
    try:
        for tokens in prompts:
            assert writer.save(tokens, state_for(tokens, size))
            assert writer.flush(timeout=30)
            time.sleep(0.005)
    finally:
        done.set()
        thread.join(60)
        writer.close(timeout=30)
        reader.close(timeout=30)
    assert not problems, problems[:5]
    assert hits > 0
    assert writer.stats().corrupt_removed == reader.stats().corrupt_removed == 0
    assert len(os.listdir(tmp_path / "kv" / "ns")) <= 3


def test_another_writers_temporary_file_is_left_alone(tmp_path: Path) -> None:
    ns = tmp_path / "kv" / "ns"
    ns.mkdir(parents=True)
    in_flight = ns / "ab.kv.otherhost-1-0.tmp"  # another replica's write in flight
    in_flight.write_bytes(b"half")
    mine_dead = ns / f"cd.kv.{_HOST}-999999999-0.tmp"  # this host's, its writer gone
    mine_dead.write_bytes(b"half")
    cache = PrefixCache(config(disk_dir=str(tmp_path / "kv")), "ns")
    cache.close(timeout=10)
    assert in_flight.exists()
    assert not _is_leftover(in_flight.name, 1.0)
    assert _is_leftover(in_flight.name, TMP_MAX_AGE_S + 1)
    assert not mine_dead.exists()
