"""Driving a `Generation` from an HTTP handler: to completion, or as a stream.

Both paths abort the engine sequences when the client goes away: a non-streaming
request races the generation against the client's disconnect; a stream is cancelled by
sse-starlette, and leaving `async with generation` aborts what is still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse
from starlette.background import BackgroundTask

from engine.engine import Generation
from engine.types import FinishReason, SeqOutput, TokenLogprob
from server.access import current_record
from server.deps import EngineLike
from server.errors import APIError, BadRequest, generation_failure

T = TypeVar("T")


class ClientDisconnected(Exception):
    pass


@dataclass(slots=True)
class Choice:
    """One sequence's accumulated result."""

    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_output_tokens: int = 0
    error: str | None = None

    def add(self, out: SeqOutput) -> None:
        if out.text:
            self.text.append(out.text)
        self.token_ids.extend(out.token_ids)
        self.logprobs.extend(out.logprobs)
        self.prompt_logprobs.extend(out.prompt_logprobs)
        if out.finish_reason is not None:
            self.finish_reason = out.finish_reason
            self.num_prompt_tokens = out.num_prompt_tokens
            self.num_cached_tokens = out.num_cached_tokens
            self.num_output_tokens = out.num_output_tokens
            self.error = out.error


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


def usage(choices: list[Choice], num_prompt_tokens: int) -> dict[str, Any]:
    """OpenAI usage: the prompt counted once, completion tokens summed over choices."""
    completion = sum(c.num_output_tokens for c in choices)
    cached = min((c.num_cached_tokens for c in choices), default=0)
    return {
        "prompt_tokens": num_prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": num_prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def finish_reason_text(reason: FinishReason | None) -> str | None:
    if reason is None or reason is FinishReason.ABORT:
        return None
    return reason.value


async def _watch_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work`; cancel it (aborting its sequences) if the client disconnects."""
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
    """The error for a sequence the engine failed (server/errors.py decides which)."""
    return generation_failure(error)


def check_n(n: int, n_seq_max: int) -> None:
    if n > n_seq_max:
        raise BadRequest(f"'n' must be at most {n_seq_max} on this server", param="n")


def client_gone() -> JSONResponse:
    """What a handler returns when its client disconnected: nobody reads it."""
    return JSONResponse({}, status_code=499)


def event_stream(events: AsyncIterator[str], on_close: Callable[[], None]) -> EventSourceResponse:
    """SSE in OpenAI's framing ("data: ...\n\n"). `on_close` runs after the stream in
    every case, also when the client left before the first event."""
    return EventSourceResponse(events, sep="\n", ping=15, background=BackgroundTask(on_close))


async def collect(generation: Generation, n: int) -> list[Choice]:
    """Run every sequence to its end. Raises ServerError if the engine failed one."""
    choices = [Choice() for _ in range(n)]
    record = current_record()
    if record is not None:
        record.watch(generation)
    async with generation:
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


async def increments(generation: Generation) -> AsyncIterator[list[tuple[int, Choice]]]:
    record = current_record()
    if record is not None:
        record.watch(generation)
    async with generation:
        async for item in generation:
            rest = generation.ready_nowait()
            if record is not None:
                for index, out in [item, *rest]:
                    record.observe(generation, index, out)
            yield merged(item, rest)


def chunk_framing(
    obj: str, response_id: str, created: int, model: str, include_usage: bool
) -> tuple[str, str]:
    """The constant JSON before and after the "choices" of every stream chunk, so
    that a chunk costs one json.dumps of its choices and nothing else."""
    head = json.dumps(
        {
            "id": response_id,
            "object": obj,
            "created": created,
            "model": model,
            "system_fingerprint": None,
        }
    )
    return head[:-1] + ',"choices":', (',"usage":null}' if include_usage else "}")
