"""The commands the event loop sends the engine thread, and `EngineThread`: all the loop
holds of that thread (the queue it sends them on, what the thread publishes).

Plain data: the worker executes them in the order they were sent, and a rebuilt worker
reads the same queue (engine/thread/recovery.py fails those it will never run).
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from engine.lane import Lane
from engine.sequence import Sequence

if TYPE_CHECKING:
    from collections.abc import Sequence as SeqType

    from cache import CacheHit, PrefixCache


@dataclass(frozen=True, slots=True)
class Submit:
    seqs: tuple[Sequence, ...]


@dataclass(frozen=True, slots=True)
class Abort:
    request_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Hold:
    """Their reader wants the whole replies: merge their outputs (engine/thread/holding.py)."""

    request_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class OpenLane:
    """Offer this sequence's outputs to `lane` first (engine/thread/lanes.py)."""

    request_id: str
    lane: Lane


@dataclass(slots=True)
class EmbedJob:
    """Inputs to embed, and (engine thread only, once sent) how far the embedder is."""

    inputs: list[list[int]]
    on_done: Callable[[list[np.ndarray] | None, str | None], None]
    results: list[np.ndarray] = field(default_factory=list)
    offset: int = 0  # tokens of inputs[len(results)] already computed
    total: np.ndarray | None = None  # running sum of token states of that input
    cancelled: bool = False


@dataclass(frozen=True, slots=True)
class Embed:
    job: EmbedJob


@dataclass(frozen=True, slots=True)
class ReleaseSession:
    """The session ended (deleted, expired or retired): its slot goes back to everyone."""

    session_id: str


@dataclass(frozen=True, slots=True)
class Fork:
    """Copy idle session `source`'s KV into a free slot pinned to new session `target`.
    `on_done(num_tokens, error)` is called on the engine thread."""

    source: str
    target: str
    on_done: Callable[[int, str | None], None]


@dataclass(frozen=True, slots=True)
class Stop:
    pass


Command = Submit | Abort | Hold | OpenLane | Embed | ReleaseSession | Fork | Stop


class EngineThread(Protocol):
    """What the event loop side (engine/loop/) holds of a running engine thread
    (engine/thread/worker.py `Worker`). Everything else of that thread's state (its
    scheduler, slots, sequences in flight) is the thread's alone: the loop neither imports
    nor reads it, which tests/test_layering.py checks."""

    @property
    def commands(self) -> queue.SimpleQueue[Command]:
        """Where the loop sends its commands, executed in order on the engine thread."""
        ...

    @property
    def pinned_sessions(self) -> Mapping[str, int]:
        """Session key -> the slot it pins, as the thread last published it (one whole
        state, never changed after it is published)."""
        ...

    def find_prefix(self, cache: PrefixCache, prompt: SeqType[int], salt: str) -> CacheHit | None:
        """The longest stored prefix `prompt` can start from (a blob-bound cache under
        exact reuse: not a longer state placement must refuse)."""
        ...
