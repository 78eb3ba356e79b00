"""The commands the event loop sends the engine thread (through `Worker.commands`).

Plain frozen data: the worker executes them in the order they were sent, and a rebuilt
worker reads the same queue (engine/recovery.py fails those it will never run).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.embedder import EmbedJob
from engine.sequence import Sequence


@dataclass(frozen=True, slots=True)
class Submit:
    seqs: tuple[Sequence, ...]


@dataclass(frozen=True, slots=True)
class Abort:
    request_ids: tuple[str, ...]


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


Command = Submit | Abort | Embed | ReleaseSession | Fork | Stop
