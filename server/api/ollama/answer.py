"""An Ollama answer from a running generation: one object, or NDJSON lines.

Chat and generate differ only in how a piece of output is shaped (`message` or
`response`) and what the final object adds (`context`), so both hand those to `answer`,
which adds the model, the time and (at the end) the counts. A stream is one JSON object
per line (`application/x-ndjson`), the last with `done: true` and the timings; a failure
midway is one last `{"error": ...}` line, which is how Ollama's clients read it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from chat.callstream import Delta
from chat.plan import OutputParser
from engine.client import FinishReason, Generation
from server.api.ollama.common import created_at, done_fields, load_wait_s
from server.http.errors import APIError, ServerError
from server.serving.drive import (
    collect,
    engine_failure,
    increments,
    until_disconnect,
)
from server.serving.state import Choice, ChoiceState, parsed

NDJSON = "application/x-ndjson"


@dataclass(slots=True)
class Piece:
    """Parsed output: text, thinking, and complete tool calls in Ollama's shape."""

    content: str = ""
    thinking: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.thinking or self.calls)


def piece(deltas: list[Delta]) -> Piece:
    result = parsed(deltas)
    calls = [{"id": c.call_id, "function": {"index": c.index, "name": c.name,
                                            "arguments": _arguments(c.arguments)}}
             for c in result.calls]  # fmt: skip
    return Piece(result.content, result.reasoning, calls)


def _arguments(text: str) -> dict[str, Any]:
    """A call's arguments as the object Ollama sends (the grammar made them JSON)."""
    try:
        value = json.loads(text) if text.strip() else {}
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ServerError(f"the model's tool call arguments are not a JSON object: {text!r}")
    return value


Shape = Callable[[Piece], dict[str, Any]]
Final = Callable[[Choice, Piece], dict[str, Any]]


def _no_extra(total: Choice) -> dict[str, Any]:
    return {}


async def answer(
    request: Request,
    generation: Generation,
    parser: OutputParser,
    *,
    model: str,
    started: float,
    stream: bool,
    shape: Shape,
    extra: Callable[[Choice], dict[str, Any]] = _no_extra,
) -> Any:
    """The whole answer (the final object of everything), or a stream of chunks and the
    final object: each `{"model", "created_at", **shape(piece)}`, then `"done": false`, or
    the final's reason, counts and timings (`started`: time.monotonic() when the route
    began) and `extra(total)`."""
    load_s = load_wait_s(request)

    def chunk(part: Piece) -> dict[str, Any]:
        return {"model": model, "created_at": created_at(), **shape(part), "done": False}

    def final(total: Choice, part: Piece) -> dict[str, Any]:
        return {"model": model, "created_at": created_at(), **shape(part),
                **done_fields(total, started, load_s), **extra(total)}  # fmt: skip

    if stream:
        return StreamingResponse(_lines(generation, parser, chunk, final), media_type=NDJSON,
                                 background=BackgroundTask(generation.abort))  # fmt: skip
    (choice,) = await until_disconnect(request, collect(generation, 1))
    return final(choice, piece(parser.feed("".join(choice.text)) + parser.finish()))


def line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


async def _lines(
    generation: Generation, parser: OutputParser, chunk: Shape, final: Final
) -> AsyncIterator[str]:
    state = ChoiceState(0, parser)
    token_ids: list[int] = []  # the whole output's (an increment carries its own only)
    try:
        async for increment in increments(generation):
            for _, inc in increment:
                if inc.finish_reason is FinishReason.ERROR:
                    raise engine_failure(inc.error)
                token_ids.extend(inc.token_ids)
                part = piece(state.advance(inc).deltas)
                if part:
                    yield line(chunk(part))
        state.total.token_ids = token_ids
        yield line(final(state.total, Piece()))
    except APIError as err:
        yield line(err.ollama_body())
