"""Sticky sessions as the API sees them: ids, owners, TTLs, one request at a time.

The registry lives on the event loop thread (no locks): it decides who may use a
session and when it expires. Which slot a session pins is the engine thread's business
(engine/slots.py); the two meet through the engine's command queue.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.types import InvalidRequestError, SessionBusyError, SessionNotFoundError

SESSION_ID = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")


def pin_key(tenant: str, session_id: str) -> str:
    """The engine thread's name for a session: ids are per tenant (two keys may each
    have a session "main"), and a session id never contains "/"."""
    return f"{tenant}/{session_id}"


@dataclass(slots=True, eq=False)
class Session:
    id: str
    tenant: str  # digest of the API key that created it
    ttl_s: float  # idle time after which it expires
    created: float
    last_used: float
    in_flight: bool = False
    num_tokens: int = 0  # tokens its last request left in the KV cache

    @property
    def expires_at(self) -> float:
        return self.last_used + self.ttl_s

    @property
    def key(self) -> str:
        return pin_key(self.tenant, self.id)


@dataclass(frozen=True, slots=True)
class SessionLimits:
    default_ttl_s: float = 600.0
    max_ttl_s: float = 86400.0
    max_sessions: int = 1024  # in all
    max_sessions_per_key: int = 256  # one tenant cannot take every session


def check_session_id(session_id: str, param: str = "session_id") -> str:
    if not SESSION_ID.fullmatch(session_id):
        raise InvalidRequestError(
            "a session id is 1 to 128 characters of letters, digits and _ . : -", param=param
        )
    return session_id


class SessionRegistry:
    """Sessions by (tenant, id): each tenant has its own ids, so another tenant's
    session is indistinguishable from a missing one, even when creating one."""

    def __init__(self, limits: SessionLimits, clock: Callable[[], float] = time.time):
        self.limits = limits
        self._clock = clock
        self._sessions: dict[tuple[str, str], Session] = {}
        self._per_tenant: dict[str, int] = {}

    def _now(self) -> float:
        return self._clock()

    def __len__(self) -> int:
        return len(self._sessions)

    def create(
        self, tenant: str, session_id: str | None = None, ttl_s: float | None = None
    ) -> Session:
        """A new idle session. Raises SessionBusyError if the id is taken or a quota
        is reached."""
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
        if self._per_tenant.get(tenant, 0) >= self.limits.max_sessions_per_key:
            raise SessionBusyError(
                f"this API key holds its maximum of {self.limits.max_sessions_per_key} sessions"
            )
        if len(self._sessions) >= self.limits.max_sessions:
            raise SessionBusyError(
                f"the server holds its maximum of {self.limits.max_sessions} sessions"
            )
        now = self._now()
        session = Session(session_id, tenant, ttl_s, now, now)
        self._sessions[tenant, session_id] = session
        self._per_tenant[tenant] = self._per_tenant.get(tenant, 0) + 1
        return session

    def get(self, tenant: str, session_id: str) -> Session:
        session = self._sessions.get((tenant, session_id))
        if session is None:
            raise SessionNotFoundError(session_id)
        return session

    def owned_by(self, tenant: str) -> list[Session]:
        return [s for s in self._sessions.values() if s.tenant == tenant]

    def begin(self, tenant: str, session_id: str) -> tuple[Session, bool]:
        """Mark a request in flight on the session, creating it on first use.
        Returns the session and whether this call created it."""
        check_session_id(session_id)
        session = self._sessions.get((tenant, session_id))
        created = session is None
        if session is None:
            session = self.create(tenant, session_id)
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
            left = self._per_tenant[session.tenant] - 1
            if left:
                self._per_tenant[session.tenant] = left
            else:
                del self._per_tenant[session.tenant]

    def expired(self) -> list[Session]:
        """Remove and return idle sessions past their TTL (in-flight ones never expire)."""
        now = self._now()
        gone = [s for s in self._sessions.values() if not s.in_flight and s.expires_at <= now]
        for session in gone:
            self.remove(session)
        return gone
