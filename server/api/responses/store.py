"""Stored Responses-API responses: kept for GET /v1/responses/{id} and for continuing a
conversation by `previous_response_id`, bounded per API key by count and age.

Each entry keeps the conversation up to and including its output (as chat messages,
without `instructions`, which OpenAI does not carry over) and the kvserve session whose
slot holds that conversation's KV, so that the next turn prefills only its new input.

Where entries live: with a shared store (`[cache] shared_url`: the Redis every replica
shares, server/api/responses/shared_store.py) there, so a chain continues on any replica;
otherwise, or while that store cannot be reached, in this process. A read that the
shared store cannot answer falls back to this process's entries.

Bounds are per key: one key's responses never push out another's. A chain's own session
(SessionPool.CHAIN) is ended when the last entry naming it here is dropped (deleted,
pushed out or expired); a session the client named is never touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from engine.client import SessionPool
from server.errors import NotFound, ServiceUnavailable
from server.serving.media import restored_conversation, stored_conversation

log = logging.getLogger("kvserve.server")


@dataclass(slots=True)
class Stored:
    tenant: str
    response: dict[str, Any]
    conversation: list[dict[str, Any]]
    session_id: str | None
    session_pool: SessionPool = SessionPool.NAMED

    @property
    def id(self) -> str:
        return str(self.response["id"])

    def to_json(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "response": self.response,  # images as base64:
                "conversation": stored_conversation(self.conversation),
                "session_id": self.session_id,
                "session_pool": self.session_pool.value}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Stored:
        return cls(data["tenant"], data["response"], restored_conversation(data["conversation"]),
                   data["session_id"], SessionPool(data["session_pool"]))  # fmt: skip


class SharedResponses(Protocol):
    """Entries every replica sees (shared_store.py). Each call may raise
    SharedUnavailable; calls block (the store runs them in a worker thread)."""

    def put(self, entry: Stored) -> list[Stored]: ...  # returns the entries pushed out
    def get(self, tenant: str, response_id: str) -> Stored | None: ...
    def delete(self, tenant: str, response_id: str) -> Stored | None: ...
    def close(self) -> None: ...


class SharedUnavailable(Exception):
    """The shared store failed just now or is in its pause after a failure."""


class LocalResponses:
    """This process's entries: per key, the newest `max_per_key`, each for `ttl_s`."""

    def __init__(self, max_per_key: int, ttl_s: float, clock: Callable[[], float]) -> None:
        self.max_per_key = max_per_key
        self.ttl_s = ttl_s
        self._clock = clock
        self._keys: dict[str, OrderedDict[str, tuple[float, Stored]]] = {}

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._keys.values())

    def put(self, entry: Stored) -> list[Stored]:
        """Keep `entry`; returns those dropped (expired, or the key's oldest past its bound)."""
        dropped = self.expire()
        entries = self._keys.setdefault(entry.tenant, OrderedDict())
        entries[entry.id] = (self._clock() + self.ttl_s, entry)
        while len(entries) > self.max_per_key:  # the key's oldest goes first
            dropped.append(entries.popitem(last=False)[1][1])
        return dropped

    def get(self, tenant: str, response_id: str) -> Stored | None:
        entries = self._keys.get(tenant)
        found = entries.get(response_id) if entries is not None else None
        return None if found is None or found[0] <= self._clock() else found[1]

    def pop(self, tenant: str, response_id: str) -> Stored | None:
        entries = self._keys.get(tenant)
        found = entries.pop(response_id, None) if entries is not None else None
        if entries is not None and not entries:
            del self._keys[tenant]
        return found[1] if found is not None else None

    def expire(self) -> list[Stored]:
        now, dropped = self._clock(), []
        for tenant in list(self._keys):
            entries = self._keys[tenant]
            while entries and next(iter(entries.values()))[0] <= now:  # oldest first
                dropped.append(entries.popitem(last=False)[1][1])
            if not entries:
                del self._keys[tenant]
        return dropped


class ResponseStore:
    """Stored responses, in the shared store when there is one (see the module doc).
    `release(tenant, session_id)` ends a chain session nothing stored here names any more."""

    def __init__(
        self,
        max_per_key: int,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
        *,
        shared: SharedResponses | None = None,
        release: Callable[[str, str], None] = lambda tenant, session_id: None,
    ) -> None:
        self.max_per_key = max_per_key
        self.ttl_s = ttl_s
        self._clock = clock
        self.local = LocalResponses(max_per_key, ttl_s, clock)
        self.shared = shared
        self._release = release
        # (tenant, chain session) -> the entries stored by this process that continue on
        # it, with when they expire: the session ends with the last of them.
        self._chains: dict[tuple[str, str], dict[str, float]] = {}

    def __len__(self) -> int:
        """Entries held in this process (not those in the shared store)."""
        self._dropped(self.local.expire())
        return len(self.local)

    async def put(self, entry: Stored) -> None:
        if self.max_per_key == 0:
            return
        if entry.session_pool is SessionPool.CHAIN and entry.session_id is not None:
            names = self._chains.setdefault((entry.tenant, entry.session_id), {})
            names[entry.id] = self._clock() + self.ttl_s
        if self.shared is not None:
            try:
                self._dropped(await asyncio.to_thread(self.shared.put, entry))
                return
            except SharedUnavailable:
                pass  # kept here instead: it serves from this replica until then
        self._dropped(self.local.put(entry))

    async def get(self, tenant: str, response_id: str, param: str | None = None) -> Stored:
        """The entry, or 404: unknown, expired and another key's look the same."""
        entry = None
        if self.shared is not None:
            with contextlib.suppress(SharedUnavailable):  # then this replica's own
                entry = await asyncio.to_thread(self.shared.get, tenant, response_id)
        if entry is None:
            self._dropped(self.local.expire())
            entry = self.local.get(tenant, response_id)
        if entry is None:
            raise NotFound(f"Response with id '{response_id}' not found.", param=param,
                           code="response_not_found")  # fmt: skip
        return entry

    async def delete(self, tenant: str, response_id: str) -> None:
        gone = self.local.pop(tenant, response_id)
        if self.shared is not None:
            try:
                gone = await asyncio.to_thread(self.shared.delete, tenant, response_id) or gone
            except SharedUnavailable:
                if gone is None:  # it may be there: say so rather than "not found"
                    raise ServiceUnavailable(
                        "the shared response store cannot be reached; try again",
                        code="store_unavailable",
                    ) from None
        if gone is None:
            raise NotFound(f"Response with id '{response_id}' not found.",
                           code="response_not_found")  # fmt: skip
        self._dropped([gone])

    def close(self) -> None:
        if self.shared is not None:
            self.shared.close()

    def _dropped(self, entries: list[Stored]) -> None:
        """End the chain sessions that the dropped entries were the last to name."""
        now = self._clock()
        for entry in entries:
            if entry.session_pool is not SessionPool.CHAIN or entry.session_id is None:
                continue
            chain = entry.tenant, entry.session_id
            names = self._chains.get(chain, {})
            names.pop(entry.id, None)
            for response_id in [r for r, expires in names.items() if expires <= now]:
                del names[response_id]  # (one the shared store let expire)
            if not names:
                self._chains.pop(chain, None)
                self._release(*chain)
