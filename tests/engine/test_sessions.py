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
    r.begin("k1", "chat-1")
    with pytest.raises(SessionBusyError):
        r.begin("k1", "chat-1")
    r.end("chat-1", 42)
    assert r.begin("k1", "chat-1").num_tokens == 42


def test_another_tenant_cannot_see_or_use_a_session() -> None:
    r, _ = registry()
    r.create("k1", "mine")
    for call in (lambda: r.get("k2", "mine"), lambda: r.begin("k2", "mine")):
        with pytest.raises(SessionNotFoundError):
            call()
    assert [s.id for s in r.owned_by("k1")] == ["mine"] and r.owned_by("k2") == []


def test_idle_sessions_expire_after_their_ttl_but_never_in_flight() -> None:
    r, clock = registry(default_ttl_s=10)
    r.create("k", "idle")
    r.begin("k", "busy")
    clock.now += 11
    assert r.expired() == ["idle"]
    with pytest.raises(SessionNotFoundError):
        r.get("k", "idle")
    r.end("busy", 1)  # last use is now: 10 more seconds
    clock.now += 9
    assert r.expired() == []
    clock.now += 2
    assert r.expired() == ["busy"]


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
