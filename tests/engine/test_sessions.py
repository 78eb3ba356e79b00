"""The session registry: ownership, one request at a time, TTLs."""

from __future__ import annotations

import pytest

from engine.config import SessionLimits
from engine.loop.sessions import SessionRegistry
from engine.types import InvalidRequestError, SessionBusyError, SessionNotFoundError, SessionPool


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
    r.begin("a", "1")
    r.begin("a", "2")
    with pytest.raises(SessionBusyError, match="API key"):
        r.create("a", "3")  # both busy: nothing to retire
    r.create("b", "1")
    r.remove(r.get("a", "1"))
    r.create("a", "3")  # a slot of the quota came back


def test_at_the_key_quota_its_least_recently_used_idle_session_is_retired() -> None:
    """Issue 17, item 19: a client that keeps opening conversations sees its oldest idle
    one retired (handed to on_retire, which saves its KV), not a 409."""
    retired: list[str] = []
    clock = Clock()
    r = SessionRegistry(SessionLimits(max_sessions_per_key=3), clock,
                        on_retire=lambda s: retired.append(s.id))  # fmt: skip
    for i in range(3):
        session, _ = r.begin("a", f"s{i}")
        clock.now += 1
        r.end(session, 10)
    clock.now += 1
    r.begin("a", "s0")  # s0 is now the most recently used
    r.end(r.get("a", "s0"), 10)
    for i in range(3, 3000):  # one after another, each finished before the next
        clock.now += 1
        session, created = r.begin("a", f"s{i}")
        assert created
        r.end(session, 10)
    assert retired[:2] == ["s1", "s2"] and len(retired) == 2997
    assert len(r.owned_by("a")) == 3
    with pytest.raises(SessionNotFoundError):
        r.get("a", "s1")
    for s in r.owned_by("a"):
        r.begin("a", s.id)
    with pytest.raises(SessionBusyError, match="every one .* in flight"):
        r.create("a", "one-more")  # 409 only when every session of the key is busy


def test_one_key_cannot_lock_the_others_out_at_the_global_bound() -> None:
    """Issue 17, item 18: at max_sessions, the least recently used idle session of the
    key holding the most is retired; a refusal only when what is left is busy."""
    retired: list[tuple[str, str]] = []
    clock = Clock()
    r = SessionRegistry(SessionLimits(max_sessions=4, max_sessions_per_key=4), clock,
                        on_retire=lambda s: retired.append((s.tenant, s.id)))  # fmt: skip
    r.create("a", "a1")
    for i in range(3):
        clock.now += 1
        r.create("b", f"b{i}")
    clock.now += 1
    r.create("a", "a2")  # b holds the most: its oldest idle session goes, not a's older one
    assert retired == [("b", "b0")]
    r.begin("b", "b1")
    r.begin("b", "b2")
    clock.now += 1
    r.create("c", "c1")  # b's are busy now: a (the next largest) gives up its oldest
    assert retired[-1] == ("a", "a1")
    r.begin("a", "a2")
    r.begin("c", "c1")
    with pytest.raises(SessionBusyError, match="maximum of 4 sessions"):
        r.create("d", "d1")  # every session is busy


def test_response_chains_have_a_pool_of_their_own() -> None:
    """Issue 17, item 4: sessions kept for stored responses neither use up nor retire
    the sessions a client names (same bounds, counted apart)."""
    retired: list[str] = []
    r = SessionRegistry(SessionLimits(max_sessions=4, max_sessions_per_key=2),
                        Clock(), on_retire=lambda s: retired.append(s.id))  # fmt: skip
    r.create("a", "named-1")
    r.create("a", "named-2")
    for i in range(10):
        chain, _ = r.begin("a", f"resp_chain_{i}", SessionPool.CHAIN)
        r.end(chain, 5)
    assert retired == [f"resp_chain_{i}" for i in range(8)]
    assert {s.id for s in r.owned_by("a")} == {"named-1", "named-2", "resp_chain_8",
                                                "resp_chain_9"}  # fmt: skip
    r.create("b", "named-1")  # the chains do not count against the global bound either
    r.create("b", "named-2")
    assert len(retired) == 8


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
    r.begin("k", minted.id)
    r.begin("k", "second")
    with pytest.raises(SessionBusyError):
        r.create("k", "third")  # over max_sessions, and both are busy


def test_a_fork_never_retires_its_own_source() -> None:
    r, _ = registry(max_sessions_per_key=1)
    source = r.create("a", "src")
    with pytest.raises(SessionBusyError, match="in flight"):
        r.create("a", "copy", spare=source)
    assert r.get("a", "src") is source
