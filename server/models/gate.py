"""ASGI middleware: a request for a model that is not loaded waits for it.

Every route that uses a model's engine (generation, embeddings, token counting, cache
warming, tokenize) passes here. The gate finds the model (the JSON body's `model`, or
the default model for the endpoints that name none), counts the request as in flight on
it (so it is not unloaded under it: an unload frees the vocabulary a tokenize reads),
marks it used (idle unloads count from the last request), and when the model is not
ready has the loader load it, unless the route would refuse the request anyway: a body
its request model refuses, a `keep_alive` the caller may not set (nothing is loaded
for a request that is answered 4xx; one without a valid key never gets here:
server/http/key_first.py answers it before its body is read). The route reads the body
as the gate parsed it (deps.GatedRoute) rather than parsing it again. `/api/show` is not gated: it
reads what the model's file says and loads nothing. A plain request simply waits; a
stream (`"stream": true`) gets its 200 and SSE comment lines (`: loading ...`) at once,
every second, so that clients and proxies see the connection alive, and then the route's
own events. A load that fails or outlasts `loading.wait_s` answers 503 with Retry-After (a
stream that has started gets one `error` event instead). Routes stay unaware of all this.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.api.chat.protocol import ChatCompletionRequest
from server.api.chat.template import ApplyTemplateRequest
from server.api.common import RequestModel
from server.api.completions.protocol import CompletionRequest
from server.api.embeddings.protocol import EmbeddingRequest
from server.api.kvserve.cache import CacheWarmRequest
from server.api.kvserve.protocol import DetokenizeRequest, TokenizeRequest
from server.api.messages.protocol import CountTokensRequest, MessagesRequest
from server.api.ollama.protocol import (
    OllamaChatRequest,
    OllamaEmbeddingsRequest,
    OllamaEmbedRequest,
    OllamaGenerateRequest,
)
from server.api.responses.protocol import ResponsesRequest
from server.http.deps import GATED_MODEL, leave_gated_body
from server.http.errors import APIError
from server.models.keep_alive import keep_alive_refusal
from server.models.served import requested_model

if TYPE_CHECKING:
    from server.models.loader import ModelLoader
    from server.models.served import ServedModel

# POSTs whose route uses the engine of the model named in the body's `model` ...
BODY_MODEL_PATHS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/cache/warm",
)
# ... or, for the token-level endpoints (llama-server's), where `model` may be left
# out, the default (first) model's.
DEFAULT_MODEL_PATHS = ("/tokenize", "/detokenize", "/apply-template")
# Ollama's routes name the model Ollama's way (`name:tag`; /api/show also as `name`).
# Their streams are NDJSON, not SSE: they wait for a load like a plain request, and
# the gate's own load wait is what their `load_duration` reports.
OLLAMA_MODEL_PATHS = ("/api/chat", "/api/generate", "/api/embed", "/api/embeddings")
# The body each gated route parses (checked before a load; on a ready model the route
# alone parses it).
BODY_MODELS: dict[str, type[RequestModel]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/v1/embeddings": EmbeddingRequest,
    "/v1/responses": ResponsesRequest,
    "/v1/messages": MessagesRequest,
    "/v1/messages/count_tokens": CountTokensRequest,
    "/v1/cache/warm": CacheWarmRequest,
    "/tokenize": TokenizeRequest,
    "/detokenize": DetokenizeRequest,
    "/apply-template": ApplyTemplateRequest,
    "/api/chat": OllamaChatRequest,
    "/api/generate": OllamaGenerateRequest,
    "/api/embed": OllamaEmbedRequest,
    "/api/embeddings": OllamaEmbeddingsRequest,
}
_COMMENT_EVERY_S = 1.0


class ModelGate:
    def __init__(self, app: ASGIApp, loader: ModelLoader):
        self.app = app
        self.loader = loader

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"] if scope["type"] == "http" and scope["method"] == "POST" else None
        ollama = path in OLLAMA_MODEL_PATHS
        if path not in BODY_MODEL_PATHS and path not in DEFAULT_MODEL_PATHS and not ollama:
            await self.app(scope, receive, send)
            return
        messages, body = await _read_body(receive)
        replay = _replayer(messages, receive)
        fields: Any = None
        if body:
            try:
                fields = json.loads(body)
            except (ValueError, RecursionError):  # the route answers bad JSON with a 400
                pass
            else:  # the route reads this instead of parsing the body again
                leave_gated_body(scope, fields)
        served: ServedModel | None
        name: Any = None  # the model's name in the body (none where the default model answers)
        if path in DEFAULT_MODEL_PATHS and not (isinstance(fields, dict) and fields.get("model")):
            served = self.loader.models.default
        else:
            name = fields.get("model") if isinstance(fields, dict) else None
            if ollama and isinstance(fields, dict):
                name = fields.get("model") or fields.get("name")
            models = self.loader.models
            served = requested_model(models, name, ollama=ollama) if isinstance(name, str) else None
        if served is not None and isinstance(name, str):
            # the route reads it (deps.gated_model) instead of looking the name up again
            scope.setdefault("state", {})[GATED_MODEL] = (name, served)
        if served is None:  # the route answers: 400 for bad JSON, 404 for a bad model
            await self.app(scope, replay, send)
            return
        if not served.engine.ready and _refused(scope, scope["path"], fields, served):
            await self.app(scope, replay, send)  # the route answers its 4xx; no load
            return
        served.in_flight += 1
        served.last_used = time.monotonic()
        try:
            if served.engine.ready:
                await self.app(scope, replay, send)
            elif path in BODY_MODEL_PATHS and _streams(fields):  # an SSE stream: not Ollama's
                await self._stream_after_load(served, scope, replay, send)
            else:
                waited = time.monotonic()
                try:
                    await self.loader.ensure_loaded(served)
                except APIError as exc:
                    await exc.response(ollama=ollama)(scope, replay, send)
                    return
                scope.setdefault("state", {})["load_wait_s"] = time.monotonic() - waited
                await self.app(scope, replay, send)
        finally:
            served.in_flight -= 1
            served.last_used = time.monotonic()

    async def _stream_after_load(
        self, served: ServedModel, scope: Scope, receive: Receive, send: Send
    ) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                ],
            }
        )
        waiting = asyncio.ensure_future(self.loader.ensure_loaded(served))
        while not waiting.done():
            progress = served.engine.load_progress
            line = f": loading model {served.id} ({progress:.0%})\n\n".encode()
            await send({"type": "http.response.body", "body": line, "more_body": True})
            await asyncio.wait({waiting}, timeout=_COMMENT_EVERY_S)
        error = waiting.exception()
        if isinstance(error, APIError):
            await _send_event(send, {"error": error.body()["error"]}, last=True)
            return
        if error is not None:
            raise error
        await self.app(scope, receive, _body_only(send))


def _streams(fields: Any) -> bool:
    return isinstance(fields, dict) and fields.get("stream") is True


def _refused(scope: Scope, path: str, fields: Any, served: ServedModel) -> bool:
    """Whether the route will refuse this body before it uses the model: its request
    model does not take it (a bad field, an unsupported one), or it carries a keep_alive
    this caller may not set."""
    try:
        body = BODY_MODELS[path].model_validate(fields)
    except (ValidationError, APIError):
        return True
    seconds = getattr(body, "keep_alive", None)
    return keep_alive_refusal(Request(scope), served, seconds) is not None


async def _read_body(receive: Receive) -> tuple[list[Message], bytes]:
    messages, chunks = [], []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return messages, b"".join(chunks)


def _replayer(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replay() -> Message:
        return pending.pop(0) if pending else await receive()

    return replay


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
            await _send_event(send, {"error": error}, last=True)

    return forward


async def _send_event(send: Send, data: dict[str, Any], *, last: bool) -> None:
    body = f"data: {json.dumps(data)}\n\n".encode()
    await send({"type": "http.response.body", "body": body, "more_body": not last})
