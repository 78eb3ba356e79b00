"""Where the stored entries are: the block index, and which indexed tier holds each entry.

Invariant: every indexed entry is held by at least one indexed tier (cache/tier.py); an
entry no tier holds leaves the index. A tier that is not blocking (RAM) changes only
under PrefixCache's lock, so it is asked (`contains`). A blocking one (disk) changes
outside it too (its writes, other models' saves in a shared budget, other processes), so
the index records which of them hold an entry (`IndexedEntry.held`), copied from the
tier under the lock (`sync`), never from a list of keys made outside it (a refresh's, a
write's, another model's): the file may have come or gone again since.

Not thread-safe: PrefixCache calls every method under its lock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from cache.index import BlockIndex, IndexedEntry
from cache.keys import block_hashes, seed
from cache.tier import Tier
from cache.types import EntryInfo


class Copies:
    def __init__(self, block_tokens: int, namespace: str, tiers: Sequence[Tier]) -> None:
        """`tiers`: every tier of the cache, in lookup order (the indexed ones are kept)."""
        indexed = tuple(tier for tier in tiers if tier.indexed)
        if tuple(tiers[: len(indexed)]) != indexed:
            raise ValueError("cache tiers: the indexed ones come first")
        if len({tier.name for tier in tiers}) != len(tiers):
            raise ValueError("cache tiers: two of one name")
        self.index = BlockIndex(block_tokens)
        self.tiers = indexed
        self._block = block_tokens
        self._namespace = namespace
        self._in_memory = tuple(tier for tier in indexed if not tier.blocking)

    def _hashes(self, info: EntryInfo) -> tuple[bytes, ...]:
        return tuple(block_hashes(info.tokens, self._block, seed(self._namespace, info.salt)))

    def in_memory(self, key: str) -> bool:
        """Whether a tier under the lock holds `key` (the index prefers those copies)."""
        return any(tier.contains(key) for tier in self._in_memory)

    def holds(self, indexed: IndexedEntry, tier: Tier) -> bool:
        if tier.blocking:
            return tier.name in indexed.held
        return tier.contains(indexed.info.key)

    def forget_if_unheld(self, indexed: IndexedEntry) -> None:
        if not any(self.holds(indexed, tier) for tier in self.tiers):
            self.index.remove(indexed.info.key)

    def drop(self, tier: Tier, keys: Iterable[str]) -> None:
        """`tier` evicted (or released) these keys."""
        for key in keys:
            indexed = self.index.get(key)
            if indexed is not None:
                indexed.held.discard(tier.name)
                self.forget_if_unheld(indexed)

    def sync(self, keys: Iterable[str]) -> None:
        """The blocking tiers holding these indexed entries, as they are now."""
        for key in keys:
            indexed = self.index.get(key)
            if indexed is not None:
                blocking = (tier for tier in self.tiers if tier.blocking)
                indexed.held = {tier.name for tier in blocking if tier.contains(key)}
                self.forget_if_unheld(indexed)

    def remove(self, key: str) -> None:
        """Out of the index and out of every indexed tier."""
        self.index.remove(key)
        for tier in self.tiers:
            tier.delete(key)

    def touch_below(self, indexed: IndexedEntry, n: int) -> None:
        """A hit in the n-th tier: its copies below are kept longer too."""
        for tier in self.tiers[n + 1 :]:
            if self.holds(indexed, tier):
                tier.touch(indexed.info.key)

    def index_stored(self) -> None:
        """Index what the tiers hold at start (an earlier run's files)."""
        for tier in self.tiers:
            for info in tier.infos():
                if self.index.get(info.key) is None:
                    hashes = self._hashes(info)
                    if not hashes:  # shorter than a block (block_tokens grew): never found
                        tier.delete(info.key)
                        continue
                    self.index.add(IndexedEntry(info, hashes))
                self.sync([info.key])

    def take_refresh(self, tier: Tier, added: list[EntryInfo], removed: list[str]) -> None:
        """What tier.refresh() found other processes did."""
        self.sync(removed)
        for info in added:
            if self.index.get(info.key) is None:
                if not tier.contains(info.key):  # our writer's save evicted it meanwhile
                    continue
                hashes = self._hashes(info)
                if not hashes:
                    continue
                self.index.add(IndexedEntry(info, hashes))
            self.sync([info.key])

    def problems(self) -> list[str]:
        """Where the index and the tiers disagree, and what the tiers find wrong."""
        held = {tier.name: {info.key for info in tier.infos()} for tier in self.tiers}
        anywhere: set[str] = set().union(*held.values())
        problems = [f"{k}: not indexed" for k in anywhere - set(self.index.keys())]
        for indexed in self.index.entries():
            key = indexed.info.key
            wrong = any(
                (tier.name in indexed.held) != (key in held[tier.name])
                for tier in self.tiers
                if tier.blocking
            )
            if wrong or key not in anywhere:
                problems.append(f"{key}: the index is wrong about where it is")
        for tier in self.tiers:
            problems += tier.problems()
        return problems
