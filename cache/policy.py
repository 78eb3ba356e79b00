"""Which entries a tier gives up when it is over its byte budget: LRU weighted by hits.

Every put and every hit advances a logical clock by one and stamps the entry. An entry's
score is its last-use stamp plus HIT_WEIGHT ticks per hit (at most HIT_CAP hits count);
the lowest score goes first. So among entries never hit this is plain LRU, and an entry
hit often (a shared system prompt) outlives up to HIT_WEIGHT * HIT_CAP newer one-off
uses, but the cap lets even a once-hot entry age out when it stops being used.
Not thread-safe: the tier that owns it locks.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

HIT_WEIGHT = 4
HIT_CAP = 16


@dataclass(slots=True)
class _Usage:
    nbytes: int
    last_used: int
    hits: int = 0

    @property
    def score(self) -> int:
        return self.last_used + HIT_WEIGHT * min(self.hits, HIT_CAP)


class UsagePolicy:
    """Byte accounting and eviction order for one tier."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.total_bytes = 0
        self._clock = 0
        self._usage: dict[str, _Usage] = {}

    def __len__(self) -> int:
        return len(self._usage)

    def __contains__(self, key: object) -> bool:
        return key in self._usage

    def keys(self) -> list[str]:
        return list(self._usage)

    def add(self, key: str, nbytes: int) -> None:
        """Track a new (or replaced) entry as just used."""
        self.remove(key)
        self._clock += 1
        self._usage[key] = _Usage(nbytes, self._clock)
        self.total_bytes += nbytes

    def touch(self, key: str, hit: bool = True) -> None:
        usage = self._usage.get(key)
        if usage is not None:
            self._clock += 1
            usage.last_used = self._clock
            usage.hits += hit

    def remove(self, key: str) -> bool:
        usage = self._usage.pop(key, None)
        if usage is None:
            return False
        self.total_bytes -= usage.nbytes
        return True

    def fits(self, nbytes: int) -> bool:
        return nbytes <= self.budget

    def victims(self, protect: Collection[str] = ()) -> list[str]:
        """Keys to remove, lowest score first, until the total fits the budget. Protected
        keys are never chosen, so the result may leave the tier over budget."""
        excess = self.total_bytes - self.budget
        if excess <= 0:
            return []
        order = sorted(
            (k for k in self._usage if k not in protect), key=lambda k: self._usage[k].score
        )
        chosen: list[str] = []
        for key in order:
            if excess <= 0:
                break
            chosen.append(key)
            excess -= self._usage[key].nbytes
        return chosen
