"""The model a request needs, as a dependency its route declares (`leased`).

Every route that uses a model's engine (generation, embeddings, token counting, cache
warming, tokenize) takes its body through `leased(TheRequestModel)` rather than as a
parameter of its own: FastAPI parses and validates the body once, and the dependency then
finds the model it names (by the rule of the route's API, server/http/apis.py; the default
model for the token-level routes when the body names none), refuses a `keep_alive` this
caller may not set (403, before anything loads: server/http/management.py), counts the
request as in flight on the model for the request's whole life, a stream's included (an
unload frees the vocabulary a tokenize reads), marks it used (idle unloads count from the
last request), and has the loader load it when it is not loaded. A load that fails or
outlasts `loading.wait_s` is a 503 with Retry-After, in the route's error shape.

A cold SSE stream (`stream: true` on a route declared with `notices=True`) does not wait
in silence: the route answers through `Lease.respond`, which sends the 200 at once and an
SSE comment (`: loading ...`) every second while the model loads, so that clients and
proxies see the connection alive, then the route's own events; a load that fails then
is one `error` event. Ollama's streams are NDJSON and wait as a plain request does (their
`load_duration` reports the wait).

A body whose model is not served goes to the route with no model leased: the route's
own lookup answers its 404 in its API's words. The model found is left in the request's
state (deps.leased_model), so the route does not look the name up again.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fastapi import Depends, Request
from pydantic import BaseModel
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from engine.client import EngineError
from server.errors import APIError, ServerError, from_engine_error, shape_of
from server.http.apis import BY_ID
from server.http.deps import LEASED_MODEL, registry
from server.http.management import check_keep_alive
from server.models.served import ServedModel

log = logging.getLogger("kvserve.server")

Body = TypeVar("Body", bound=BaseModel)
_NOTICE_EVERY_S = 1.0


@dataclass(slots=True)
class Lease(Generic[Body]):
    """A route's parsed body and the model it names (None: not served, the route's
    404), held for the request's life; `loading`: a cold stream's load, still running."""

    body: Body
    served: ServedModel | None
    request: Request
    loading: asyncio.Future[None] | None = None

    async def respond(self, answer: Callable[[], Awaitable[Any]]) -> Any:
        """The route's answer: `answer()` at once, or for a cold stream a 200 whose
        loading notices come first and `answer()`'s events after them."""
        if self.loading is None:
            return await answer()
        assert self.served is not None
        return _AfterLoad(self.served, self.loading, self.request, answer)


def leased(model: type[Body], *, default_model: bool = False, notices: bool = False) -> Any:
    """The dependency of a route whose body is `model`: `Annotated[Lease[M], leased(M)]`.
    `default_model`: a body without a `model` is for the default (first) model;
    `notices`: the route streams SSE and answers through `Lease.respond`."""

    async def lease(request: Request, body: Any) -> AsyncIterator[Lease[Any]]:
        served = _served(request, body, default_model)
        if served is None:  # the route answers its 404
            yield Lease(body, None, request)
            return
        keep_alive = getattr(body, "keep_alive", None)  # Ollama's bodies have one
        if keep_alive is not None:
            check_keep_alive(request, served, keep_alive)
        served.in_flight += 1
        served.last_used = time.monotonic()
        try:
            found = Lease(body, served, request)
            if not served.engine.ready:
                load = request.app.state.loader.ensure_loaded(served)
                if notices and getattr(body, "stream", None) is True:
                    found.loading = asyncio.ensure_future(load)
                else:
                    waited = time.monotonic()
                    await load
                    request.state.load_wait_s = time.monotonic() - waited  # Ollama's timings
            yield found
        finally:
            served.in_flight -= 1
            served.last_used = time.monotonic()

    # FastAPI reads a dependency's parameters from its signature: the body's is `model`.
    params = [
        inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request),
        inspect.Parameter("body", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=model),
    ]
    lease.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return Depends(lease)


def _served(request: Request, body: Any, default_model: bool) -> ServedModel | None:
    models = registry(request)
    name = getattr(body, "model", None)
    if default_model and not name:
        return models.default
    if not isinstance(name, str):
        return None
    route = request.scope.get("route")  # FastAPI's, for the path it was declared with
    names = request.app.state.apis.model_names.get(getattr(route, "path", None), BY_ID)
    served = names(models, name)
    if served is not None:  # the route reads it (deps.leased_model) rather than look again
        setattr(request.state, LEASED_MODEL, (name, served))
    return served


class _AfterLoad(Response):
    """A cold stream: the 200 and a comment every second while the model loads, then
    the route's answer without its own start (an error answer as one `error` event)."""

    def __init__(
        self,
        served: ServedModel,
        loading: asyncio.Future[None],
        request: Request,
        answer: Callable[[], Awaitable[Any]],
    ):
        # Not Response.__init__: it would announce a body of 0 bytes (content-length).
        self.status_code, self.background = 200, None
        self.raw_headers = [(b"content-type", b"text/event-stream; charset=utf-8"),
                            (b"cache-control", b"no-cache")]  # fmt: skip
        self.served, self.loading, self.request, self.answer = served, loading, request, answer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        while not self.loading.done():
            progress = self.served.engine.load_progress
            line = f": loading model {self.served.id} ({progress:.0%})\n\n".encode()
            await send({"type": "http.response.body", "body": line, "more_body": True})
            await asyncio.wait({self.loading}, timeout=_NOTICE_EVERY_S)
        try:
            self.loading.result()
        except APIError as exc:  # the status line is gone: the error is the last event
            await _send_error(send, exc.body()["error"])
            return
        try:
            answer = await self.answer()
        except Exception as exc:  # answered as the app's handlers answer it (errors.py)
            await _send_error(send, self._error_of(exc))
            return
        if not isinstance(answer, Response):
            raise TypeError(f"a stream's route answered {type(answer).__name__}, not a stream")
        await answer(scope, receive, _body_only(send))

    def _error_of(self, exc: Exception) -> Any:
        if isinstance(exc, APIError | EngineError):
            mapped = from_engine_error(exc)
        else:
            log.exception("unhandled error on %s", self.request.url.path, exc_info=exc)
            mapped = ServerError(f"internal error: {type(exc).__name__}")
        shape = shape_of(self.request.scope["path"])
        return (mapped.body() if shape is None else shape(mapped)).get("error")


def _body_only(send: Send) -> Send:
    """The route's stream after our own 200 went out: its start is dropped; a route that
    answers with an error instead sends it as one `error` event."""
    state: dict[str, Any] = {"status": 200, "body": b""}

    async def forward(message: Message) -> None:
        if message["type"] == "http.response.start":
            state["status"] = message["status"]
            return
        if state["status"] == 200 or message["type"] != "http.response.body":
            await send(message)
            return
        state["body"] += message.get("body", b"")
        if not message.get("more_body", False):
            try:
                error = json.loads(state["body"]).get("error")
            except (ValueError, AttributeError):
                error = {"message": state["body"].decode("utf-8", "replace")}
            await _send_error(send, error)

    return forward


async def _send_error(send: Send, error: Any) -> None:
    body = f"data: {json.dumps({'error': error})}\n\n".encode()
    await send({"type": "http.response.body", "body": body, "more_body": False})
