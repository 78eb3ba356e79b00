"""Which stored entry shares the longest prefix with a prompt, in O(blocks).

Every entry is listed under each of its block-boundary hashes (`through`), and under its
deepest one (`ending`). The hashes chain over the salt and every earlier block, so an
entry listed under a prompt's h_k shares the prompt's first k blocks (the token ids are
compared anyway: a hash match is never trusted alone). Not thread-safe: PrefixCache
locks.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from cache.types import EntryInfo

# At the deepest shared boundary, entries can differ only in the next partial block, so
# comparing many of them gains less than one block; the most recently stored few decide.
MAX_CANDIDATES = 16


@dataclass(slots=True)
class IndexedEntry:
    info: EntryInfo
    hashes: tuple[bytes, ...]  # h_1..h_k of its full blocks
    # The blocking tiers (disk) holding a copy, as last copied from them under the
    # cache's lock (PrefixCache._sync_copies); tiers under the lock are asked instead.
    held: set[str] = field(default_factory=set)

    @property
    def tokens(self) -> tuple[int, ...]:
        return self.info.tokens


def _extend(a: tuple[int, ...], b: tuple[int, ...], start: int) -> int:
    """Common prefix length of a and b, known to be at least `start`."""
    n = min(len(a), len(b))
    i = start
    while i < n and a[i] == b[i]:
        i += 1
    return i


class BlockIndex:
    def __init__(self, block_tokens: int) -> None:
        self._block = block_tokens
        self._entries: dict[str, IndexedEntry] = {}
        self._through: dict[bytes, dict[str, None]] = {}  # insertion-ordered sets
        self._ending: dict[bytes, dict[str, None]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[str]:
        return list(self._entries)

    def entries(self) -> list[IndexedEntry]:
        return list(self._entries.values())

    def get(self, key: str) -> IndexedEntry | None:
        return self._entries.get(key)

    def add(self, entry: IndexedEntry) -> None:
        key = entry.info.key
        self.remove(key)
        self._entries[key] = entry
        for h in entry.hashes:
            self._through.setdefault(h, {})[key] = None
        self._ending.setdefault(entry.hashes[-1], {})[key] = None

    def remove(self, key: str) -> IndexedEntry | None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        for table, hashes in ((self._through, entry.hashes), (self._ending, entry.hashes[-1:])):
            for h in hashes:
                keys = table[h]
                del keys[key]
                if not keys:
                    del table[h]
        return entry

    def best_match(
        self,
        tokens: tuple[int, ...],
        hashes: Sequence[bytes],
        prefer: Callable[[str], bool] = lambda key: False,
    ) -> tuple[IndexedEntry, int] | None:
        """The entry sharing the longest prefix with `tokens`, and that length; among
        equally long ones, one that `prefer` likes (PrefixCache: one already in RAM)."""
        depth = next((k for k in range(len(hashes), 0, -1) if hashes[k - 1] in self._through), 0)
        if depth == 0:
            return None
        start = depth * self._block
        best: IndexedEntry | None = None
        best_rank = (-1, False)
        for key in itertools.islice(reversed(self._through[hashes[depth - 1]]), MAX_CANDIDATES):
            candidate = self._entries[key]
            rank = (_extend(candidate.tokens, tokens, start), prefer(key))
            if rank > best_rank:
                best, best_rank = candidate, rank
        if best is None or best.tokens[:start] != tokens[:start]:  # a hash collision
            return None
        return best, best_rank[0]

    def longest_prefix_entry(
        self,
        tokens: tuple[int, ...],
        hashes: Sequence[bytes],
        prefer: Callable[[str], bool] = lambda key: False,
    ) -> tuple[IndexedEntry, int] | None:
        """The longest entry whose tokens are a proper prefix of `tokens`, and its length
        (for states that are valid only for exactly their tokens: a recurrent memory)."""
        found = self.extended_by(tokens, hashes)
        if not found:
            return None
        best = max(found, key=lambda e: (len(e.tokens), prefer(e.info.key)))
        return best, len(best.tokens)

    def covering(self, tokens: tuple[int, ...], hashes: Sequence[bytes]) -> IndexedEntry | None:
        """A stored entry whose tokens start with all of `tokens` (equal counts)."""
        if not hashes:
            return None
        start, end = len(hashes) * self._block, len(tokens)
        for key in self._through.get(hashes[-1], ()):
            candidate = self._entries[key].tokens
            if (
                len(candidate) >= end
                and candidate[start:end] == tokens[start:]
                and candidate[:start] == tokens[:start]
            ):
                return self._entries[key]
        return None

    def extended_by(self, tokens: tuple[int, ...], hashes: Sequence[bytes]) -> list[IndexedEntry]:
        """Stored entries whose tokens are a proper prefix of `tokens`."""
        found = []
        for h in hashes:
            for key in self._ending.get(h, ()):
                candidate = self._entries[key].tokens
                if len(candidate) < len(tokens) and tokens[: len(candidate)] == candidate:
                    found.append(self._entries[key])
        return found
