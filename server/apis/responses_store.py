"""Stored Responses-API responses: kept for GET /v1/responses/{id} and for continuing a
conversation by `previous_response_id`, bounded by count and age, owned by an API key.

Each entry keeps the conversation up to and including its output (as chat messages,
without `instructions`, which OpenAI does not carry over) and the kvserve session whose
slot holds that conversation's KV, so that the next turn prefills only its new input.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from server.errors import NotFound


@dataclass(slots=True)
class Stored:
    tenant: str
    response: dict[str, Any]
    conversation: list[dict[str, Any]]
    session_id: str | None
    expires_at: float


class ResponseStore:
    def __init__(self, max_stored: int, ttl_s: float,
                 clock: Callable[[], float] = time.monotonic):  # fmt: skip
        self.max_stored = max_stored
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: OrderedDict[str, Stored] = OrderedDict()

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    def put(self, tenant: str, response: dict[str, Any], conversation: list[dict[str, Any]],
            session_id: str | None) -> None:  # fmt: skip
        if self.max_stored == 0:
            return
        self._expire()
        entry = Stored(tenant, response, conversation, session_id, self._clock() + self.ttl_s)
        self._entries[response["id"]] = entry
        while len(self._entries) > self.max_stored:  # the oldest goes first
            self._entries.popitem(last=False)

    def get(self, tenant: str, response_id: str, param: str | None = None) -> Stored:
        """The entry, or 404: unknown, expired and another key's look the same."""
        self._expire()
        entry = self._entries.get(response_id)
        if entry is None or entry.tenant != tenant:
            raise NotFound(f"Response with id '{response_id}' not found.", param=param,
                           code="response_not_found")  # fmt: skip
        return entry

    def delete(self, tenant: str, response_id: str) -> None:
        self.get(tenant, response_id)
        del self._entries[response_id]

    def _expire(self) -> None:
        now = self._clock()
        while self._entries:
            first = next(iter(self._entries.values()))
            if first.expires_at > now:
                return
            self._entries.popitem(last=False)
