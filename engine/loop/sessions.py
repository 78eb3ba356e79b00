"""Sticky sessions as the API sees them: ids, owners, TTLs, one request at a time.

The registry lives on the event loop thread (no locks): it decides who may use a
session and when it expires. Which slot a session pins is the engine thread's business
(engine/thread/slots.py); the two meet through the engine's command queue.

Bounds act like an LRU cache, not a wall: a new session past a bound retires an idle
one (handed to `on_retire`; the engine saves its KV to the prefix cache, so its prefix
stays warm): at the per-key bound the key's own least recently used, at the global bound
that of the key holding the most. Only when every candidate has a request in flight is
the new session refused. Each SessionPool is bounded and retired on its own.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import secrets
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine.config import SessionLimits
from engine.sequence import pin_key
from engine.types import (
    GenerateRequest,
    InvalidRequestError,
    SessionBusyError,
    SessionNotFoundError,
    SessionPool,
)

log = logging.getLogger("kvserve.engine")

SESSION_ID = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")


@dataclass(slots=True, eq=False)
class Session:
    id: str
    tenant: str  # digest of the API key that created it
    ttl_s: float  # idle time after which it expires
    created: float
    last_used: float
    in_flight: bool = False
    num_tokens: int = 0  # tokens its last request left in the KV cache
    pool: SessionPool = SessionPool.NAMED

    @property
    def expires_at(self) -> float:
        return self.last_used + self.ttl_s

    @property
    def key(self) -> str:
        return pin_key(self.tenant, self.id)


def check_session_id(session_id: str, param: str = "session_id") -> str:
    if not SESSION_ID.fullmatch(session_id):
        raise InvalidRequestError(
            "a session id is 1 to 128 characters of letters, digits and _ . : -", param=param
        )
    return session_id


class SessionRegistry:
    """Sessions by (tenant, id): each tenant has its own ids, so another tenant's
    session is indistinguishable from a missing one, even when creating one."""

    def __init__(
        self,
        limits: SessionLimits,
        clock: Callable[[], float] = time.time,
        on_retire: Callable[[Session], None] = lambda session: None,
    ):
        self.limits = limits
        self._clock = clock
        self._on_retire = on_retire
        self._sessions: dict[tuple[str, str], Session] = {}
        self._counts: Counter[tuple[SessionPool, str]] = Counter()  # sessions per key
        self._totals: Counter[SessionPool] = Counter()
        self.num_retired = 0

    def _now(self) -> float:
        return self._clock()

    def __len__(self) -> int:
        return len(self._sessions)

    def idle_seconds(self, session: Session) -> float:
        return self._now() - session.last_used

    def create(
        self,
        tenant: str,
        session_id: str | None = None,
        ttl_s: float | None = None,
        pool: SessionPool = SessionPool.NAMED,
        *,
        spare: Session | None = None,
    ) -> Session:
        """A new idle session, retiring an idle one past a bound (never `spare`).
        Raises SessionBusyError if the id is taken, or a bound is reached and every
        session that could make room has a request in flight."""
        if ttl_s is None:
            ttl_s = self.limits.default_ttl_s
        if not 0 < ttl_s <= self.limits.max_ttl_s:
            raise InvalidRequestError(
                f"ttl_s must be in (0, {self.limits.max_ttl_s:g}]", param="ttl_s"
            )
        if session_id is None:
            session_id = "sess_" + secrets.token_hex(12)
        check_session_id(session_id, "id")
        if (tenant, session_id) in self._sessions:
            raise SessionBusyError(f"session '{session_id}' already exists")
        self._make_room(tenant, pool, spare)
        now = self._now()
        session = Session(session_id, tenant, ttl_s, now, now, pool=pool)
        self._sessions[tenant, session_id] = session
        self._counts[pool, tenant] += 1
        self._totals[pool] += 1
        return session

    def _make_room(self, tenant: str, pool: SessionPool, spare: Session | None) -> None:
        """Below both bounds: nothing. At the key's bound: retire its least recently used
        idle session. At the global bound: that of the key holding the most sessions
        with an idle one (one key never locks the others out)."""
        limits = self.limits
        if self._counts[pool, tenant] >= limits.max_sessions_per_key:
            victim = self._least_recent(pool, tenant, spare)
            if victim is None:
                raise SessionBusyError(
                    f"every one of this API key's {limits.max_sessions_per_key} sessions"
                    " has a request in flight"
                )
        elif self._totals[pool] >= limits.max_sessions:
            victim = self._least_recent(pool, None, spare)
            if victim is None:
                raise SessionBusyError(
                    f"the server holds its maximum of {limits.max_sessions} sessions,"
                    " every one with a request in flight"
                )
        else:
            return
        self.remove(victim)
        self.num_retired += 1
        self._on_retire(victim)

    def _least_recent(
        self, pool: SessionPool, tenant: str | None, spare: Session | None
    ) -> Session | None:
        """The least recently used idle session of `tenant` (None: of the key holding the
        most sessions among those with an idle one), in `pool`; None if all are busy."""
        idle = [
            s for s in self._sessions.values()
            if s.pool is pool and not s.in_flight and s is not spare
            and (tenant is None or s.tenant == tenant)
        ]  # fmt: skip
        if not idle:
            return None
        if tenant is None:
            largest = max(self._counts[pool, s.tenant] for s in idle)
            idle = [s for s in idle if self._counts[pool, s.tenant] == largest]
        return min(idle, key=lambda s: s.last_used)  # the first of equals: the oldest

    def get(self, tenant: str, session_id: str) -> Session:
        session = self._sessions.get((tenant, session_id))
        if session is None:
            raise SessionNotFoundError(session_id)
        return session

    def owned_by(self, tenant: str) -> list[Session]:
        return [s for s in self._sessions.values() if s.tenant == tenant]

    def all(self) -> list[Session]:
        """Every tenant's sessions (the admin's status view)."""
        return list(self._sessions.values())

    def busy(self, tenant: str, session_id: str) -> bool:
        """Whether the session exists and has a request in flight (`begin` would refuse)."""
        session = self._sessions.get((tenant, session_id))
        return session is not None and session.in_flight

    def begin(
        self, tenant: str, session_id: str, pool: SessionPool = SessionPool.NAMED
    ) -> tuple[Session, bool]:
        """Mark a request in flight on the session, creating it (in `pool`) on first use.
        Returns the session and whether this call created it."""
        check_session_id(session_id)
        session = self._sessions.get((tenant, session_id))
        created = session is None
        if session is None:
            session = self.create(tenant, session_id, pool=pool)
        if session.in_flight:
            raise SessionBusyError(f"session '{session_id}' already has a request in flight")
        session.in_flight = True
        session.last_used = self._now()
        return session, created

    def end(self, session: Session, num_tokens: int) -> None:
        """The request begun on `session` ended: only that session object changes, even
        if its id now names another one."""
        session.in_flight = False
        session.last_used = self._now()
        session.num_tokens = num_tokens

    def remove(self, session: Session) -> None:
        """Forget `session` (if it is still the one registered under its id)."""
        if self._sessions.get((session.tenant, session.id)) is session:
            del self._sessions[session.tenant, session.id]
            count = session.pool, session.tenant
            self._counts[count] -= 1
            if not self._counts[count]:
                del self._counts[count]
            self._totals[session.pool] -= 1

    def expired(self) -> list[Session]:
        """Remove and return idle sessions past their TTL (in-flight ones never expire)."""
        now = self._now()
        gone = [s for s in self._sessions.values() if not s.in_flight and s.expires_at <= now]
        for session in gone:
            self.remove(session)
        return gone


def unpinned_if_busy(
    sessions: SessionRegistry, requests: Sequence[GenerateRequest]
) -> Sequence[GenerateRequest]:
    """A session is a hint, not a lock (`[sessions] when_busy`): a request on a session
    that already has one in flight runs without it, on what the cache holds, instead of
    a 409. Agents send two requests on one id at once (opencode's title request beside
    its turn, both under its own `x-kvserve-session`)."""
    first = requests[0] if requests else None
    if (first is None or first.session_id is None
            or sessions.limits.when_busy != "unpinned"
            or not sessions.busy(first.tenant, first.session_id)):  # fmt: skip
        return requests
    log.info("session '%s' is busy: this request runs unpinned", first.session_id)
    return [dataclasses.replace(r, session_id=None) for r in requests]
