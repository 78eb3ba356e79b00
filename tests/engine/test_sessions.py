"""The session registry: ownership, one request at a time, TTLs."""

from __future__ import annotations

import pytest

from engine.sessions import SessionLimits, SessionRegistry
from engine.types import InvalidRequestError, SessionBusyError, SessionNotFoundError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def registry(**limits: float) -> tuple[SessionRegistry, Clock]:
    clock = Clock()
    return SessionRegistry(SessionLimits(**limits), clock), clock  # type: ignore[arg-type]


def test_first_use_creates_and_a_second_concurrent_use_is_refused() -> None:
    r, _ = registry()
    session, created = r.begin("k1", "chat-1")
    assert created
    with pytest.raises(SessionBusyError):
        r.begin("k1", "chat-1")
    r.end(session, 42)
    again, created = r.begin("k1", "chat-1")
    assert again is session and again.num_tokens == 42 and not created


def test_ids_are_per_tenant_another_tenant_sees_an_unused_id() -> None:
    """Issue 9, item 4: another key learns nothing about ids a key holds."""
    r, _ = registry()
    mine = r.create("k1", "mine")
    with pytest.raises(SessionNotFoundError):
        r.get("k2", "mine")
    assert r.owned_by("k2") == []
    theirs = r.create("k2", "mine")  # exactly as for an unused id
    assert theirs is not mine and theirs.key != mine.key
    assert r.get("k1", "mine") is mine and r.get("k2", "mine") is theirs
    assert [s.id for s in r.owned_by("k1")] == ["mine"]


def test_an_ended_request_touches_only_the_session_it_began_on() -> None:
    """Issue 9, item 2: the id may name a new session by the time the request ends."""
    r, _ = registry()
    old, _ = r.begin("k", "s")
    r.end(old, 7)
    r.remove(old)
    new = r.create("k", "s")
    r.end(old, 99)  # a late end of the old session's request
    assert new.num_tokens == 0 and not new.in_flight
    r.remove(old)  # removing the old object again leaves the new one alone
    assert r.get("k", "s") is new


def test_a_per_key_quota_leaves_room_for_other_keys() -> None:
    r, _ = registry(max_sessions=4, max_sessions_per_key=2)
    r.create("a", "1")
    r.create("a", "2")
    with pytest.raises(SessionBusyError, match="API key"):
        r.create("a", "3")
    r.create("b", "1")
    r.remove(r.get("a", "1"))
    r.create("a", "3")  # a slot of the quota came back


def test_idle_sessions_expire_after_their_ttl_but_never_in_flight() -> None:
    r, clock = registry(default_ttl_s=10)
    r.create("k", "idle")
    busy, _ = r.begin("k", "busy")
    clock.now += 11
    assert [s.id for s in r.expired()] == ["idle"]
    with pytest.raises(SessionNotFoundError):
        r.get("k", "idle")
    r.end(busy, 1)  # last use is now: 10 more seconds
    clock.now += 9
    assert r.expired() == []
    clock.now += 2
    assert r.expired() == [busy]


def test_ids_ttls_and_limits_are_checked() -> None:
    r, _ = registry(default_ttl_s=50, max_ttl_s=100, max_sessions=2)
    with pytest.raises(InvalidRequestError):
        r.create("k", "has space")
    with pytest.raises(InvalidRequestError):
        r.create("k", "x" * 129)
    for ttl in (0, -1, 101):
        with pytest.raises(InvalidRequestError):
            r.create("k", "ok", ttl)
    minted = r.create("k")
    assert minted.id.startswith("sess_")
    with pytest.raises(SessionBusyError):
        r.create("k", minted.id)  # taken
    r.create("k", "second")
    with pytest.raises(SessionBusyError):
        r.create("k", "third")  # over max_sessions
