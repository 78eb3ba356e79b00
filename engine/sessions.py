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


@dataclass(slots=True)
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


@dataclass(frozen=True, slots=True)
class SessionLimits:
    default_ttl_s: float = 600.0
    max_ttl_s: float = 86400.0
    max_sessions: int = 1024


def check_session_id(session_id: str, param: str = "session_id") -> str:
    if not SESSION_ID.fullmatch(session_id):
        raise InvalidRequestError(
            "a session id is 1 to 128 characters of letters, digits and _ . : -", param=param
        )
    return session_id


class SessionRegistry:
    """Sessions by id. Another tenant's session is indistinguishable from a missing one."""

    def __init__(self, limits: SessionLimits, clock: Callable[[], float] = time.time):
        self.limits = limits
        self._clock = clock
        self._sessions: dict[str, Session] = {}

    def _now(self) -> float:
        return self._clock()

    def __len__(self) -> int:
        return len(self._sessions)

    def create(
        self, tenant: str, session_id: str | None = None, ttl_s: float | None = None
    ) -> Session:
        """A new idle session. Raises SessionBusyError if the id is taken."""
        if ttl_s is None:
            ttl_s = self.limits.default_ttl_s
        if not 0 < ttl_s <= self.limits.max_ttl_s:
            raise InvalidRequestError(
                f"ttl_s must be in (0, {self.limits.max_ttl_s:g}]", param="ttl_s"
            )
        if session_id is None:
            session_id = "sess_" + secrets.token_hex(12)
        check_session_id(session_id, "id")
        if session_id in self._sessions:
            raise SessionBusyError(f"session '{session_id}' already exists")
        if len(self._sessions) >= self.limits.max_sessions:
            raise SessionBusyError(
                f"the server holds its maximum of {self.limits.max_sessions} sessions"
            )
        now = self._now()
        session = Session(session_id, tenant, ttl_s, now, now)
        self._sessions[session_id] = session
        return session

    def get(self, tenant: str, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None or session.tenant != tenant:
            raise SessionNotFoundError(session_id)
        return session

    def owned_by(self, tenant: str) -> list[Session]:
        return [s for s in self._sessions.values() if s.tenant == tenant]

    def begin(self, tenant: str, session_id: str) -> Session:
        """Mark a request in flight on the session, creating it on first use."""
        check_session_id(session_id)
        session = self._sessions.get(session_id)
        if session is None:
            session = self.create(tenant, session_id)
        elif session.tenant != tenant:
            raise SessionNotFoundError(session_id)
        if session.in_flight:
            raise SessionBusyError(f"session '{session_id}' already has a request in flight")
        session.in_flight = True
        session.last_used = self._now()
        return session

    def end(self, session_id: str, num_tokens: int) -> None:
        session = self._sessions.get(session_id)
        if session is not None:
            session.in_flight = False
            session.last_used = self._now()
            session.num_tokens = num_tokens

    def remove(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def expired(self) -> list[str]:
        """Remove and return idle sessions past their TTL (in-flight ones never expire)."""
        now = self._now()
        gone = [
            s.id for s in self._sessions.values() if not s.in_flight and s.expires_at <= now
        ]
        for session_id in gone:
            del self._sessions[session_id]
        return gone
