"""Which entries a tier gives up when it is over its byte budget: LRU weighted by hits.

Every put and every hit advances a logical clock by one and stamps the entry. An entry's
score is its last-use stamp plus HIT_WEIGHT ticks per hit (at most HIT_CAP hits count);
the lowest score goes first. So among entries never hit this is plain LRU, and an entry
hit often (a shared system prompt) outlives up to HIT_WEIGHT * HIT_CAP newer one-off
uses, but the cap lets even a once-hot entry age out when it stops being used.
Not thread-safe: the tier that owns it locks.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

HIT_WEIGHT = 4
HIT_CAP = 16
Key = TypeVar("Key", bound=Hashable)  # a tier's entry key; (tier, key) in a shared Pool


@dataclass(slots=True)
class _Usage:
    nbytes: int
    last_used: int
    hits: int = 0

    @property
    def score(self) -> int:
        return self.last_used + HIT_WEIGHT * min(self.hits, HIT_CAP)


class UsagePolicy(Generic[Key]):
    """Byte accounting and eviction order for one tier (or for several: cache/budget.py)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.total_bytes = 0
        self._clock = 0
        self._usage: dict[Key, _Usage] = {}

    def __len__(self) -> int:
        return len(self._usage)

    def __contains__(self, key: object) -> bool:
        return key in self._usage

    def keys(self) -> list[Key]:
        return list(self._usage)

    def size(self, key: Key) -> int:
        """The bytes counted for `key` (0: not counted)."""
        usage = self._usage.get(key)
        return usage.nbytes if usage is not None else 0

    def add(self, key: Key, nbytes: int) -> None:
        """Track a new (or replaced) entry as just used."""
        self.remove(key)
        self._clock += 1
        self._usage[key] = _Usage(nbytes, self._clock)
        self.total_bytes += nbytes

    def touch(self, key: Key, hit: bool = True) -> None:
        usage = self._usage.get(key)
        if usage is not None:
            self._clock += 1
            usage.last_used = self._clock
            usage.hits += hit

    def remove(self, key: Key) -> bool:
        usage = self._usage.pop(key, None)
        if usage is None:
            return False
        self.total_bytes -= usage.nbytes
        return True

    def fits(self, nbytes: int) -> bool:
        return nbytes <= self.budget

    def victims(self, protect: Collection[Key] = ()) -> list[Key]:
        """Keys to remove, lowest score first, until the total fits the budget. Protected
        keys are never chosen, so the result may leave the tier over budget."""
        excess = self.total_bytes - self.budget
        if excess <= 0:
            return []
        order = sorted(
            (k for k in self._usage if k not in protect), key=lambda k: self._usage[k].score
        )
        chosen: list[Key] = []
        for key in order:
            if excess <= 0:
                break
            chosen.append(key)
            excess -= self._usage[key].nbytes
        return chosen
