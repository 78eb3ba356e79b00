"""The shared tier's store: Redis, seen by every replica.

Layout, under `kvserve:<namespace>:` (the namespace names the model and KV layout):

    e:<entry key>:<salt, hex>
                     the entry as one record (cache/record.py: namespace, salt, token
                     ids, state, CRC-32), exactly the bytes of a disk file; its salt is
                     in its name, so one tenant's entries are found by a SCAN
    b:<block hash>   the name (after `e:`) of the newest entry passing through that
                     block boundary

Block hashes chain over the salt and every earlier block (cache/keys.py), so a prompt's
longest stored prefix is found with one MGET of its boundaries and one GET of the entry
behind the deepest pointer. Nothing read is trusted: the record's namespace, salt,
tokens and checksum are verified, and a corrupt or foreign value is a miss (and deleted).
Every key has a TTL; the store's own memory limit (maxmemory + an LRU policy) is the
byte budget, so a pointer may outlive its entry: that is a miss too. A hit renews the
entry and the pointers that led to it. (Names without a salt, of an older layout, are
never read: they expire.)

Errors are the caller's business (cache/shared.py counts them and backs off). Every
call is bounded by the socket timeout, and the client never retries on its own.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import cache.record as record
from cache.types import Entry

KEY_PREFIX = "kvserve"
MAX_POINTERS = 4  # entries tried, deepest boundary first, when newer ones have expired
ERRORS: tuple[type[BaseException], ...] = (redis.RedisError, OSError)  # store down or slow


def redis_client(url: str, timeout_s: float) -> redis.Redis:
    """A client for the store every replica shares: each call bounded by `timeout_s`,
    never retried (a down store costs one timeout, not several). The responses store
    (server/api/responses/shared_store.py) uses the same."""
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
        health_check_interval=0,
    )


def redis_peer(url: str) -> tuple[str, int | None]:
    """The store's host (or unix socket path) and port, for traces: never the password
    a redis:// URL may carry."""
    where = urlsplit(url)
    return where.hostname or where.path, where.port


class RedisTier:
    """The SharedStore of cache/shared.py on Redis: find() turns a prompt's block hashes
    into the names of its longest stored prefixes; get/touch/delete by name. Entries are
    found by hash, and listed (a SCAN) only to delete them: by salt, or all."""

    name = "shared"

    def __init__(self, url: str, namespace: str, timeout_s: float, ttl_s: float) -> None:
        self._client = redis_client(url, timeout_s)
        self.address, self.port = redis_peer(url)
        self._namespace = namespace
        self._prefix = f"{KEY_PREFIX}:{namespace}:"
        self._ttl_ms = int(ttl_s * 1000)

    def _entry_key(self, name: str) -> str:
        return f"{self._prefix}e:{name}"

    def name_of(self, entry: Entry) -> str:
        return f"{entry.key}:{entry.salt.encode().hex()}"

    def _pointer_key(self, block_hash: bytes) -> str:
        return f"{self._prefix}b:{block_hash.hex()}"

    def find(self, hashes: Sequence[bytes], min_depth: int) -> list[tuple[int, str]]:
        """(depth, entry key) of the entries listed at the deepest boundaries past
        `min_depth` blocks, deepest first (at most MAX_POINTERS distinct keys)."""
        depths = list(range(len(hashes), min_depth, -1))
        if not depths:
            return []
        found = self._client.mget([self._pointer_key(hashes[d - 1]) for d in depths])
        out: list[tuple[int, str]] = []
        seen: set[str] = set()
        for depth, raw in zip(depths, found, strict=True):
            if raw is None:
                continue
            name = raw.decode("ascii", "replace") if isinstance(raw, bytes) else str(raw)
            if name not in seen and _salt_in(name) is not None:
                seen.add(name)
                out.append((depth, name))
            if len(out) == MAX_POINTERS:
                break
        return out

    def get(self, name: str) -> Entry | None:
        """The verified entry, or None when absent. Raises record.CorruptRecord for a
        value that is not a valid entry of this namespace under this name (the caller
        deletes it)."""
        raw = self._client.get(self._entry_key(name))
        if raw is None:
            return None
        if not isinstance(raw, bytes):  # decode_responses is off: never, short of a bug
            raise record.CorruptRecord("not bytes")
        f = io.BytesIO(raw)
        head = record.read_head(f, self._namespace, len(raw))
        state = record.read_state(f, head)
        entry = Entry(name.partition(":")[0], head.salt, head.tokens, state)
        if self.name_of(entry) != name:  # a purge by salt trusts the name
            raise record.CorruptRecord("name does not match contents")
        return entry

    def put(self, entry: Entry, hashes: Sequence[bytes]) -> int:
        """Store the entry, then point each of its block boundaries at it (one round trip,
        entry first: a pointer never names an entry not yet written). Returns the bytes."""
        data = b"".join(bytes(piece) for piece in record.encode(self._namespace, entry))
        name = self.name_of(entry)
        pipe = self._client.pipeline(transaction=False)
        pipe.set(self._entry_key(name), data, px=self._ttl_ms)
        for h in hashes:
            pipe.set(self._pointer_key(h), name, px=self._ttl_ms)
        pipe.execute()
        return len(data)

    def touch(self, name: str, hashes: Sequence[bytes]) -> None:
        """A hit renews the TTL of the entry and of the block boundaries (`hashes`) that
        lead to it (one round trip)."""
        pipe = self._client.pipeline(transaction=False)
        pipe.pexpire(self._entry_key(name), self._ttl_ms)
        for h in hashes:
            pipe.pexpire(self._pointer_key(h), self._ttl_ms)
        pipe.execute()

    def delete(self, name: str) -> bool:
        return bool(self._client.unlink(self._entry_key(name)))

    def delete_where(self, owns: Callable[[str], bool]) -> int:
        """Drop the entries whose salt `owns` accepts (every replica's); how many. Their
        pointers stay until they expire: a pointer to no entry is a miss."""
        marker = f"{self._prefix}e:"
        doomed = []
        for raw in self._client.scan_iter(match=f"{marker}*", count=1000):
            salt = _salt_in(raw.decode("ascii", "replace")[len(marker) :])
            if salt is not None and owns(salt):
                doomed.append(raw)
        for start in range(0, len(doomed), 1000):
            self._client.unlink(*doomed[start : start + 1000])
        return len(doomed)

    def clear(self) -> int:
        """Drop this namespace's entries and pointers (every replica's); the entries."""
        entries = 0
        batch: list[bytes] = []
        for name in self._client.scan_iter(match=f"{self._prefix}*", count=1000):
            entries += name.startswith(f"{self._prefix}e:".encode())
            batch.append(name)
            if len(batch) >= 1000:
                self._client.unlink(*batch)
                batch.clear()
        if batch:
            self._client.unlink(*batch)
        return entries

    def close(self) -> None:
        self._client.close()


def _salt_in(name: str) -> str | None:
    """The salt an entry name carries (`name_of`); None for a name of another layout."""
    _, colon, salt_hex = name.partition(":")
    if not colon:
        return None
    try:
        return bytes.fromhex(salt_hex).decode()
    except ValueError:  # UnicodeDecodeError included
        return None
