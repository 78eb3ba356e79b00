"""The named events of the APIs that name them (Responses, Messages), made from one
choice's parsed output as it comes: each API's builder decides the events, this loop
feeds it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from chat.callstream import Delta
from engine.client import Generation
from server.serving import sse
from server.serving.drive import steps
from server.serving.state import ChoiceState

NamedEvent = tuple[str, dict[str, Any]]  # an event's name and payload (Responses, Messages)


class EventBuilder(Protocol):
    """Parsed output -> the named events of an API that names them."""

    def feed(self, deltas: list[Delta]) -> None: ...

    def drain(self) -> list[NamedEvent]: ...


async def named_events(
    generation: Generation,
    state: ChoiceState,
    builder: EventBuilder,
    beat: NamedEvent | None = None,
) -> AsyncIterator[NamedEvent]:
    """The events `builder` makes of one choice's output, increment by increment; with
    `beat`, that event after every sse.HEARTBEAT_S seconds without output."""
    async for increment in steps(generation, [state], None if beat is None else sse.HEARTBEAT_S):
        if not increment and beat is not None:
            yield beat
        for step in increment:
            builder.feed(step.deltas)
        for event in builder.drain():
            yield event
