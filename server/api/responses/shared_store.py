"""Stored responses in the Redis every replica shares (`[cache] shared_url`), so that
`previous_response_id` continues a conversation on any replica, as a session does.

Layout, under `kvserve:responses:` (beside the prefix cache's `kvserve:<namespace>:`):

    r:<response id>   the entry as JSON (tenant, response, conversation, session), with
                      the store's TTL
    k:<tenant>        a sorted set of that key's response ids by time stored (ms): the
                      per-key bound pops its oldest, whichever replica stored them

What is read is checked: an entry of another key is a miss, as is one that is not JSON.
Like the shared cache tier (cache/shared.py), a failed call is logged once and the store
is then left alone for `retry_s`; the caller falls back to this replica's own entries.
Calls block (each bounded by `timeout_s`): the caller runs them in a worker thread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

import redis

from engine.client import redis_client, redis_peer
from server.api.responses.store import SharedUnavailable, Stored
from server.telemetry.tracing import span

log = logging.getLogger("kvserve.server")
T = TypeVar("T")
PREFIX = "kvserve:responses:"
ERRORS: tuple[type[BaseException], ...] = (redis.RedisError, OSError)


class RedisResponses:
    def __init__(
        self, url: str, *, max_per_key: int, ttl_s: float, timeout_s: float, retry_s: float
    ) -> None:
        self._client = redis_client(url, timeout_s)
        self.max_per_key = max_per_key
        self._ttl_ms = int(ttl_s * 1000)
        self._retry_s = retry_s
        self._lock = threading.Lock()
        self._down_until = 0.0
        self._down = False
        self.errors = 0
        address, port = redis_peer(url)  # for traces (never the password)
        self._span_attributes: dict[str, Any] = {"db.system.name": "redis",
                                                 "server.address": address}  # fmt: skip
        if port:
            self._span_attributes["server.port"] = port

    def _call(self, operation: str, fn: Callable[[], T]) -> T:
        """fn(), or SharedUnavailable on a store error and during the pause after one.
        A span `redis <operation>` when tracing is on (none while the store is paused)."""
        if time.monotonic() < self._down_until:
            raise SharedUnavailable()
        try:
            with span(f"redis {operation}", **self._span_attributes):
                result = fn()
        except ERRORS as e:
            with self._lock:
                self.errors += 1
                self._down_until = time.monotonic() + self._retry_s
                was_down, self._down = self._down, True
            if not was_down:
                log.warning("responses: shared store down (%s): stored responses are kept "
                            "on this replica; next try in %gs", e, self._retry_s)  # fmt: skip
            raise SharedUnavailable() from e
        with self._lock:
            was_down, self._down = self._down, False
        if was_down:
            log.info("responses: shared store reachable again")
        return result

    def put(self, entry: Stored) -> list[Stored]:
        return self._call("put_response", lambda: self._put(entry))

    def get(self, tenant: str, response_id: str) -> Stored | None:
        return self._call("get_response", lambda: self._get(tenant, response_id))

    def delete(self, tenant: str, response_id: str) -> Stored | None:
        return self._call("delete_response", lambda: self._delete(tenant, response_id))

    def close(self) -> None:
        with contextlib.suppress(*ERRORS):
            self._client.close()

    # -- the Redis side -----------------------------------------------------------------

    def _put(self, entry: Stored) -> list[Stored]:
        """Store the entry; pop the key's oldest past its bound. Returns those popped."""
        now_ms = int(time.time() * 1000)
        index = _index_key(entry.tenant)
        pipe = self._client.pipeline(transaction=True)
        pipe.set(_record_key(entry.id), json.dumps(entry.to_json()), px=self._ttl_ms)
        pipe.zadd(index, {entry.id: now_ms})
        pipe.zremrangebyscore(index, "-inf", now_ms - self._ttl_ms)  # expired ones
        pipe.pexpire(index, self._ttl_ms)
        pipe.zcard(index)
        count = int(pipe.execute()[-1])
        if count <= self.max_per_key:
            return []
        excess = count - self.max_per_key
        popped = cast(list[tuple[bytes, float]], self._client.zpopmin(index, excess))
        if not popped:
            return []
        pipe = self._client.pipeline(transaction=False)
        for member, _score in popped:
            pipe.getdel(_record_key(member.decode("utf-8", "replace")))
        return [e for raw in pipe.execute() if (e := _decode(raw, entry.tenant)) is not None]

    def _get(self, tenant: str, response_id: str) -> Stored | None:
        return _decode(self._client.get(_record_key(response_id)), tenant)

    def _delete(self, tenant: str, response_id: str) -> Stored | None:
        entry = self._get(tenant, response_id)
        if entry is None:
            return None  # another key's entry stays, as if it did not exist
        pipe = self._client.pipeline(transaction=True)
        pipe.delete(_record_key(response_id))
        pipe.zrem(_index_key(tenant), response_id)
        return entry if pipe.execute()[0] else None


def _record_key(response_id: str) -> str:
    return f"{PREFIX}r:{response_id}"


def _index_key(tenant: str) -> str:
    return f"{PREFIX}k:{tenant}"


def _decode(raw: object, tenant: str) -> Stored | None:
    """The entry if it is `tenant`'s and well formed; None otherwise (absent, another
    key's, or not an entry at all)."""
    if not isinstance(raw, bytes | str):
        return None
    try:
        entry = Stored.from_json(json.loads(raw))
    except (ValueError, KeyError, TypeError):
        log.warning("responses: a shared entry is not a stored response; ignored")
        return None
    return entry if entry.tenant == tenant else None
