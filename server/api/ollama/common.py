"""What Ollama's `/api/*` routes share: model names, keep_alive, options, timings.

- Names: Ollama's `name:tag` forms resolve to a configured id or alias
  (`resolve_ollama_model`, server/models/served.py); an unknown one is a 404 in Ollama's words.
- keep_alive: parsed with the body, checked here, applied by the route once the request
  has passed every other check (server/models/keep_alive.py: who may set it).
- options: parsed with the body by their own model (`OllamaOptions`, in
  server/api/ollama/protocol.py); `num_ctx` is checked here against the model's context.
- Timings: the final object's durations, in nanoseconds, from the engine's own stage
  times of the sequence (queued, prefilled, finished) and the wait for a cold model's
  load (server/http/lease.py).
- Answers (`answer`): chat and generate differ only in how a piece of output is shaped
  (`message` or `response`) and what the final object adds (`context`), so both hand
  those to `answer`, which adds the model, the time and (at the end) the counts. A
  stream is one JSON object per line (`application/x-ndjson`), the last with `done:
  true` and the timings; a failure midway is one last `{"error": ...}` line, which is how
  Ollama's clients read it.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from chat.callstream import Delta
from engine.client import FinishReason, Generation
from server.api.ollama.protocol import OllamaOptions
from server.errors import (
    APIError,
    BadRequest,
    NotFound,
    ServerError,
    generation_failure,
)
from server.http.deps import claim, leased_model, ready_engine, registry
from server.http.management import check_keep_alive
from server.models.keep_alive import apply_keep_alive
from server.models.served import ServedModel, resolve_ollama_model
from server.serving.drive import collect, steps, until_disconnect
from server.serving.media import chat_part, image_from_base64, image_from_url
from server.serving.state import Choice, ChoiceState, parsed


def content_with_images(text: str, images: list[Any] | None, where: str = "") -> Any:
    """A turn's text with its `images` (base64, as Ollama sends them) before it, as
    Ollama places them; the text alone without images."""
    if not images:
        return text
    prefix = f"{where}." if where else ""
    parts = [chat_part(image_from_url(image, f"{prefix}images[{k}]")
                       if isinstance(image, str) and image.startswith("data:")
                       else image_from_base64(image, None, f"{prefix}images[{k}]"))
             for k, image in enumerate(images)]  # fmt: skip
    return [*parts, {"type": "text", "text": text}]


def ollama_model(request: Request, name: str, *, require_ready: bool = True) -> ServedModel:
    """The served model a request names: 404 in Ollama's words if none."""
    served = leased_model(request, name) or resolve_ollama_model(registry(request), name)
    if served is None:
        raise NotFound(f'model "{name}" not found, try pulling it first', param="model")
    return claim(served, require_ready=require_ready)


def kept_model(request: Request, name: str, keep_alive: float | None) -> ServedModel:
    """The model a generating or embedding request names, once its `keep_alive` (seconds,
    parsed with the body) is one this caller may set (403: server/models/keep_alive.py). The
    route applies it (`apply_keep_alive`) once the rest of the request has passed."""
    served = ollama_model(request, name, require_ready=False)
    if keep_alive is not None:  # its 403 before any 503 (not loaded)
        check_keep_alive(request, served, keep_alive)
    ready_engine(served.engine)
    return served


# -- options -----------------------------------------------------------------------------


def check_num_ctx(opts: OllamaOptions, n_ctx: int) -> None:
    """`options.num_ctx` (the rest of the options is checked as the body is parsed: its
    model, server/api/ollama/protocol.py `OllamaOptions`) within this model's context."""
    if opts.num_ctx is not None and not 1 <= opts.num_ctx <= n_ctx:
        raise BadRequest(f"'options.num_ctx' must be between 1 and this model's context "
                         f"of {n_ctx} tokens", param="options.num_ctx")  # fmt: skip


def within_window(opts: OllamaOptions, num_prompt: int) -> int | None:
    """The token limit once `num_ctx` is honoured: the prompt must fit the window, and
    the answer ends where the window does."""
    if opts.num_ctx is None:
        return opts.max_tokens
    room = opts.num_ctx - num_prompt
    if room < 1:
        raise BadRequest(f"the prompt has {num_prompt} tokens; options.num_ctx is "
                         f"{opts.num_ctx}", param="options.num_ctx",
                         code="context_length_exceeded")  # fmt: skip
    return room if opts.max_tokens is None else min(room, opts.max_tokens)


# -- the final object --------------------------------------------------------------------


def created_at() -> str:
    """Ollama's timestamps: RFC 3339 in UTC with fractional seconds."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _ns(seconds: float) -> int:
    return max(0, int(seconds * 1e9))


def load_wait_s(request: Request) -> float:
    """How long the request waited for its model to load (0: it was loaded;
    server/http/lease.py)."""
    return float(request.scope.get("state", {}).get("load_wait_s", 0.0))


def done_fields(total: Choice, started: float, load_s: float) -> dict[str, Any]:
    """The final object's reason and counts. `started`: time.monotonic() when the route
    began; `prompt_eval_count` counts the prompt tokens evaluated, not those whose KV
    was reused (a session, the prefix cache, a warm slot)."""
    if total.finish_reason not in (FinishReason.STOP, FinishReason.LENGTH):
        raise generation_failure(total.error or "the sequence was aborted")
    t = total.timings
    end = total.finished_at or time.monotonic()
    scheduled = t.scheduled if t and t.scheduled is not None else started
    prompt_done = t.prompt_done if t and t.prompt_done is not None else end
    return {
        "done": True,
        "done_reason": "length" if total.finish_reason is FinishReason.LENGTH else "stop",
        "total_duration": _ns(end - started + load_s),
        "load_duration": _ns(load_s),
        "prompt_eval_count": max(0, total.num_prompt_tokens - total.num_cached_tokens),
        "prompt_eval_duration": _ns(prompt_done - scheduled),
        "eval_count": total.num_output_tokens,
        "eval_duration": _ns(end - prompt_done),
    }


async def load_answer(
    request: Request, served: ServedModel, model: str, keep_alive: float | None,
    extra: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """An empty prompt only loads the model (its model dependency did that before the route
    ran) or, with keep_alive 0, unloads it before answering, as Ollama does. A model
    still busy with other requests goes once idle (its keep-alive is 0 now)."""
    apply_keep_alive(served, keep_alive)
    unload = keep_alive == 0
    if unload:
        await request.app.state.loader.unload(served, own=1)
    return {"model": model, "created_at": created_at(), **extra, "done": True,
            "done_reason": "unload" if unload else "load"}  # fmt: skip


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
    """A call's arguments (JSON text, as generated: server/serving/state.py ParsedCall)
    as the object Ollama's wire has (the grammar made them JSON)."""
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
    state: ChoiceState,
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
        return StreamingResponse(_lines(generation, state, chunk, final), media_type=NDJSON,
                                 background=BackgroundTask(generation.abort))  # fmt: skip
    (choice,) = await until_disconnect(request, collect(generation, 1))
    return final(choice, piece(state.advance(choice).deltas))


def line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


async def _lines(
    generation: Generation, state: ChoiceState, chunk: Shape, final: Final
) -> AsyncIterator[str]:
    """The stream's lines, from the shared driver's parsed steps (server/serving/drive.py
    `steps`: a failed sequence raises there, and leaves as the last line here)."""
    try:
        async for increment in steps(generation, [state]):
            for step in increment:
                part = piece(step.deltas)
                if part:
                    yield line(chunk(part))
        state.total.token_ids = state.sampled_ids  # the whole output's (`context`)
        yield line(final(state.total, Piece()))
    except APIError as err:
        yield line(err.ollama_body())
