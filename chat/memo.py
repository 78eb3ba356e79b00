"""A memo bounded by bytes: grammars built from client schemas, kept for reuse.

Agents resend the same tools and schemas with every turn, so their grammars are worth
keeping; but a key is a client's canonical JSON (up to the request body limit) and a
value the grammar built from it, so a bound by count alone (functools.lru_cache) lets
a few hundred large schemas hold gigabytes. Thread-safe (conversions may run in worker
threads); the value is built outside the lock, and an exception is never memoized.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from cachetools import LRUCache

V = TypeVar("V")


def _entry_size(entry: tuple[object, int]) -> int:
    return entry[1]


class ByteMemo(Generic[V]):
    """Least recently used entries go first once keys and values pass `max_bytes`;
    an entry larger than a quarter of the budget is built every time, never kept."""

    def __init__(self, max_bytes: int, size_of: Callable[[V], int]):
        self.max_bytes = max_bytes
        self._size_of = size_of
        # (value, its key's and its own bytes): the LRU counts the entries' sizes
        self._entries: LRUCache[str, tuple[V, int]] = LRUCache(max_bytes, _entry_size)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return int(self._entries.currsize)

    def get(self, key: str, make: Callable[[], V]) -> V:
        with self._lock:
            found = self._entries.get(key)  # a hit is the most recently used again
            if found is not None:
                return found[0]
        value = make()
        size = len(key) + self._size_of(value)
        if size > self.max_bytes // 4:
            return value
        with self._lock:
            if key not in self._entries:
                self._entries[key] = (value, size)  # pushes out the least recent past the bound
        return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
