"""PurgeLog: which purges came after a save was queued, so a save a purge covers never
lands afterwards (a tier's writer stores saves a while after they were queued).

A save is stamped with `generation` when queued; a purge of every entry, or of the
entries whose salt a predicate accepts (one tenant's), starts a new generation. Only the
last KEEP purges are remembered: a save older than all of them counts as covered (it is
dropped rather than risk keeping what a forgotten purge removed).

Not thread-safe on its own: the owner calls it under its lock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

KEEP = 64


class PurgeLog:
    def __init__(self) -> None:
        self.generation = 0
        self._purges: deque[tuple[int, Callable[[str], bool] | None]] = deque(maxlen=KEEP)

    def record(self, owns: Callable[[str], bool] | None = None) -> None:
        """A purge now: of every entry (`owns` None), or of those whose salt it accepts."""
        self.generation += 1
        self._purges.append((self.generation, owns))

    def covers(self, generation: int, salt: str) -> bool:
        """Whether a purge since `generation` removed entries of `salt`."""
        if generation == self.generation:
            return False
        if self._purges[0][0] > generation + 1:  # the first purge after it is forgotten
            return True
        return any(g > generation and (owns is None or owns(salt)) for g, owns in self._purges)
