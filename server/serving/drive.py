"""Driving a `Generation` from an HTTP handler: to completion, or as a stream.

Both paths abort the engine sequences when the client goes away: a non-streaming
request races the generation against the client's disconnect; a stream is cancelled by
the stream's response, and leaving `async with generation` aborts what is still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from fastapi import Request

from engine.client import EngineLike, FinishReason, Generation, SeqOutput
from server.errors import APIError, BadRequest, ClientDisconnected, generation_failure
from server.serving.state import Choice, ChoiceState, Step
from server.telemetry.access import current_record

T = TypeVar("T")



# Texts longer than this are tokenized on a worker thread, so that one huge prompt does
# not hold up the event loop (and every other stream) while it is split into tokens.
TOKENIZE_INLINE_CHARS = 16_384


async def tokenize(
    engine: EngineLike, text: str, *, add_special: bool, parse_special: bool
) -> list[int]:
    if len(text) <= TOKENIZE_INLINE_CHARS:
        return engine.tokenize(text, add_special=add_special, parse_special=parse_special)
    return await asyncio.to_thread(
        engine.tokenize, text, add_special=add_special, parse_special=parse_special
    )


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


async def _watch_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work`; cancel it (aborting its sequences) if the client disconnects, then
    raise ClientDisconnected (server/errors.py answers it, for every API)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_watch_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise ClientDisconnected()


def engine_failure(error: str | None) -> APIError:
    """The error for a sequence the engine failed: 504 naming a time limit, else 500
    naming the cause (server/errors.py decides which)."""
    return generation_failure(error)


def check_n(n: int, n_seq_max: int) -> None:
    if n > n_seq_max:
        raise BadRequest(f"'n' must be at most {n_seq_max} on this server", param="n")


async def collect(generation: Generation, n: int) -> list[Choice]:
    """Run every sequence to its end. Raises ServerError if the engine failed one."""
    choices = [Choice() for _ in range(n)]
    record = current_record()
    if record is not None:
        record.watch(generation)
    async with generation:
        generation.hold_outputs()  # read whole: no wake-up of this loop per token
        async for index, out in generation:
            if record is not None:
                record.observe(generation, index, out)
            choices[index].add(out)
    for choice in choices:
        if choice.finish_reason is FinishReason.ERROR:
            raise engine_failure(choice.error)
    return choices


def merged(
    first: tuple[int, SeqOutput], rest: list[tuple[int, SeqOutput]]
) -> list[tuple[int, Choice]]:
    """Fold the outputs ready right now into one increment per choice (a slow reader
    then sends fewer, larger chunks instead of falling behind)."""
    by_index: dict[int, Choice] = {}
    for index, out in [first, *rest]:
        by_index.setdefault(index, Choice()).add(out)
    return list(by_index.items())


async def increments(
    generation: Generation, beat_s: float | None = None
) -> AsyncIterator[list[tuple[int, Choice]]]:
    """The outputs ready at each wake-up, merged per choice; with `beat_s`, an empty
    list after every `beat_s` seconds without one (the stream's heartbeat)."""
    record = current_record()
    if record is not None:
        record.watch(generation)
    async with generation:
        items = generation if beat_s is None else generation.outputs(beat_s)
        async for item in items:
            if item is None:
                yield []
                continue
            rest = generation.ready_nowait(written=item[1].written)
            if record is not None:
                for index, out in [item, *rest]:
                    record.observe(generation, index, out)
            yield merged(item, rest)


async def steps(
    generation: Generation, states: list[ChoiceState], beat_s: float | None = None
) -> AsyncIterator[list[Step]]:
    """The parsed steps of each increment (with `beat_s`, an empty list is a heartbeat:
    see `increments`). A choice the engine failed raises the ServerError naming the
    cause (a stream turns it into its error tail)."""
    async for increment in increments(generation, beat_s):
        out = []
        for index, inc in increment:
            if inc.finish_reason is FinishReason.ERROR:
                raise engine_failure(inc.error)
            out.append(states[index].advance(inc))
        yield out
