"""ASGI middleware: the access record (log line, metrics, shutdown gate); body size limit
and the body's type (JSON, whatever the client declared)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.http.errors import PayloadTooLarge, RequestTimeout, ServiceUnavailable
from server.telemetry.access import AccessRecord, activate, deactivate, request_id_from

if TYPE_CHECKING:
    from server.process.drain import Lifecycle
    from server.telemetry.metrics import ServerMetrics


class BodyLimit:
    """Refuse request bodies over `limit` bytes with 413, and bodies that have not
    arrived in full `timeout_s` after their head with 408, before the app parses them
    (and before authentication: a stalled body held its connection for ever, issue 17).

    The body is read here (our bodies are JSON documents, read whole anyway) and
    replayed to the app as `application/json` whatever its declared Content-Type: curl
    sends `-d '{...}'` as a form, and Ollama's and llama-server's clients count on the
    body being read as JSON anyway (no route takes a form or a file). Later `receive()`
    calls pass through, so the app still sees the client's disconnect. (Pages of other
    sites, which may send such bodies without a preflight, are kept out by
    server/http/origins.py.)"""

    def __init__(self, app: ASGIApp, limit: int, timeout_s: float):
        self.app = app
        self.limit = limit
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _has_body(scope):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._too_large().response()(scope, receive, send)
            return
        try:
            async with asyncio.timeout(self.timeout_s):
                body = await self._read(receive)
        except TimeoutError:
            # The client sends nothing more: close the connection instead of waiting.
            message = f"the request body did not arrive within {self.timeout_s:g} s"
            headers = {"Connection": "close"}
            error = RequestTimeout(message, code="body_timeout", headers=headers)
            await error.response()(scope, receive, send)
            return
        if body is None:  # the client left
            return
        if len(body) > self.limit:
            await self._too_large().response()(scope, receive, send)
            return
        replay: Message | None = {"type": "http.request", "body": body, "more_body": False}

        async def replayed() -> Message:
            nonlocal replay
            if replay is not None:
                message, replay = replay, None
                return message
            return await receive()

        _as_json(scope)
        await self.app(scope, replayed, send)

    def _too_large(self) -> PayloadTooLarge:
        message = f"the request body exceeds the limit of {self.limit} bytes"
        return PayloadTooLarge(message, code="body_too_large")

    async def _read(self, receive: Receive) -> bytes | None:
        """The whole body (or its first bytes past the limit); None: disconnected."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body = message.get("body", b"")
            size += len(body)
            chunks.append(body)
            if size > self.limit or not message.get("more_body", False):
                return b"".join(chunks)


_JSON = (b"content-type", b"application/json")


def _as_json(scope: Scope) -> None:
    """Replace the request's Content-Type (if any) by application/json: in `scope`
    itself, not a copy, for the router writes the route it found into it (the access
    record reads it from there)."""
    headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
    scope["headers"] = [*headers, _JSON]


def _has_body(scope: Scope) -> bool:
    """Whether the request carries a body (h11 reads one only with either header)."""
    headers = dict(scope["headers"])
    return headers.get(b"content-length", b"0") != b"0" or b"transfer-encoding" in headers


# Answered while the server drains for shutdown, so that probes and a last scrape work.
_ALWAYS_OPEN = ("/health", "/livez", "/metrics")


class AccessMiddleware:
    """The outermost layer: request id, access record and log line, request metrics,
    and shutdown's gate (503 for new requests while draining)."""

    def __init__(
        self,
        app: ASGIApp,
        lifecycle: Lifecycle,
        metrics: ServerMetrics | None,
        log_lines: bool,
    ):
        self.app = app
        self.lifecycle = lifecycle
        self.metrics = metrics
        self.log_lines = log_lines

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        request_id = request_id_from(headers.get(b"x-request-id", b"").decode("latin-1"))
        record = AccessRecord(request_id, scope["method"], scope["path"], self.metrics)
        session = headers.get(b"x-session-id")
        if session:
            record.session = session.decode("latin-1")[:128]
        echoed = (b"x-request-id", request_id.encode("latin-1"))

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
                message = {**message, "headers": [*message.get("headers", []), echoed]}
            await send(message)

        token = activate(record)
        self.lifecycle.inflight.add(record)
        try:
            if self.lifecycle.draining and scope["path"] not in _ALWAYS_OPEN:
                refusal = ServiceUnavailable(
                    "the server is shutting down",
                    code="shutting_down",
                    headers={"Retry-After": "1"},
                )
                await refusal.response()(scope, receive, send_with_id)
            else:
                await self.app(scope, receive, send_with_id)
        finally:
            self.lifecycle.inflight.discard(record)
            deactivate(token)
            route = scope.get("route")
            record.endpoint = getattr(route, "path", "other")
            if record.status == 0:  # the app raised before answering
                record.status = 500
            record.finish(log_line=self.log_lines)
