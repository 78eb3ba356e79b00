"""A memo bounded by bytes: grammars built from client schemas, kept for reuse.

Agents resend the same tools and schemas with every turn, so their grammars are worth
keeping; but a key is a client's canonical JSON (up to the request body limit) and a
value the grammar built from it, so a bound by count alone (functools.lru_cache) lets
a few hundred large schemas hold gigabytes. Thread-safe (conversions may run in worker
threads); the value is built outside the lock, and an exception is never memoized.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

V = TypeVar("V")


class ByteMemo(Generic[V]):
    """Least recently used entries go first once keys and values pass `max_bytes`;
    an entry larger than a quarter of the budget is built every time, never kept."""

    def __init__(self, max_bytes: int, size_of: Callable[[V], int]):
        self.max_bytes = max_bytes
        self._size_of = size_of
        self._entries: OrderedDict[str, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, make: Callable[[], V]) -> V:
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                return found[0]
        value = make()
        size = len(key) + self._size_of(value)
        if size > self.max_bytes // 4:
            return value
        with self._lock:
            if key not in self._entries:
                self._entries[key] = (value, size)
                self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self.bytes -= dropped
        return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes = 0
