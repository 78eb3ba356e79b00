"""Purges against saves still on their way to a tier: what a purge covers never lands."""

from __future__ import annotations

import threading

import pytest

from cache.purges import KEEP, PurgeLog
from cache.types import Entry
from tests.cache.conftest import MakeCache
from tests.cache.util import disk_of, state_for


def _t1(salt: str) -> bool:
    return salt == "t1"


def test_a_tenant_purge_discards_its_saves_queued_or_being_written(
    make_cache: MakeCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 17, item 9: a save queued (or half stored) before a tenant's purge does not
    land after it; other tenants' saves do."""
    cache = make_cache()
    disk = disk_of(cache)
    assert disk is not None
    writing, go = threading.Event(), threading.Event()
    real_put = disk.put

    def slow_put(entry: Entry, protect: object = ()) -> list[str]:
        writing.set()
        assert go.wait(10)
        return real_put(entry)

    monkeypatch.setattr(disk, "put", slow_put)
    first, second, other = [1, 1, 1, 1, 9], [2, 2, 2, 2, 9], [3, 3, 3, 3, 9]
    assert cache.save(first, state_for(first), salt="t1")  # its file is being written...
    assert writing.wait(10)
    assert cache.save(second, state_for(second), salt="t1")  # ...this one waits in the queue
    assert cache.save(other, state_for(other), salt="t2")
    cache.purge_where(_t1)
    go.set()
    assert cache.flush(timeout=10)
    assert cache.entries_of(_t1) == (0, 0)
    assert cache.entries_of(lambda salt: salt == "t2") == (1, len(other))
    assert cache.lookup(first, "t1") is None and cache.lookup(second, "t1") is None
    assert [info.salt for info in disk.infos()] == ["t2"]
    cache.check_integrity()


def test_the_purge_log() -> None:
    log = PurgeLog()
    assert not log.covers(0, "t1")
    log.record(_t1)
    assert log.covers(0, "t1") and not log.covers(0, "t2") and not log.covers(1, "t1")
    log.record()  # everything
    assert log.covers(1, "t2")
    for _ in range(KEEP):
        log.record(_t1)
    assert log.covers(0, "t2")  # older than every purge it remembers: covered, to be safe
    assert not log.covers(log.generation - 1, "t2")
