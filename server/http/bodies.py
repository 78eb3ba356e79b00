"""Request bodies: each one's size and arrival time bounded, and what all of them hold
at once. Behind KeyFirst (server/http/key_first.py): a body is read here only for a
caller with a key, or for a route open without one."""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.errors import PayloadTooLarge, RequestTimeout, ServiceUnavailable, shaped


class BodyBudget:
    """The bytes of request bodies held at once, across every connection, within
    `limit`: each connection's own bound (`max_body_bytes`, `body_timeout_s`) times
    `max_connections` is no bound on memory. One event loop takes and gives: no lock."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, size: int) -> bool:
        if self.held + size > self.limit:
            return False
        self.held += size
        return True

    def give(self, size: int) -> None:
        self.held -= size


class BodyLimit:
    """Refuse request bodies over `limit` bytes with 413, and bodies that have not
    arrived in full `timeout_s` after their head with 408, before the app parses them
    (a stalled body held its connection for ever, issue 17); and, while `budget` is
    spent, new bodies with 503 (Retry-After): a body is counted from its first byte
    (its whole declared Content-Length at once) until its request has been answered,
    for the route holds it (and what it parsed from it) until then.

    The body is read here (our bodies are JSON documents, read whole anyway) and
    replayed to the app as `application/json` whatever its declared Content-Type: curl
    sends `-d '{...}'` as a form, and Ollama's and llama-server's clients count on the
    body being read as JSON anyway (no route takes a form or a file). Later `receive()`
    calls pass through, so the app still sees the client's disconnect. (Pages of other
    sites, which may send such bodies without a preflight, are kept out by
    OriginGuard.)"""

    def __init__(self, app: ASGIApp, limit: int, timeout_s: float, budget: BodyBudget):
        self.app = app
        self.limit = limit
        self.timeout_s = timeout_s
        self.budget = budget

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _has_body(scope):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        size = int(declared) if declared is not None and declared.isdigit() else 0
        if size > self.limit:
            await shaped(self._too_large(), scope["path"])(scope, receive, send)
            return
        held = _Held(self.budget)
        try:
            if not held.grow(size):
                await shaped(_over_budget(), scope["path"])(scope, receive, send)
                return
            await self._read_and_run(scope, receive, send, held)
        finally:
            held.release()

    async def _read_and_run(self, scope: Scope, receive: Receive, send: Send, held: _Held) -> None:
        try:
            async with asyncio.timeout(self.timeout_s):
                body = await self._read(receive, held)
        except TimeoutError:
            # The client sends nothing more: close the connection instead of waiting.
            message = f"the request body did not arrive within {self.timeout_s:g} s"
            headers = {"Connection": "close"}
            error = RequestTimeout(message, code="body_timeout", headers=headers)
            await shaped(error, scope["path"])(scope, receive, send)
            return
        except _OverBudget:
            await shaped(_over_budget(), scope["path"])(scope, receive, send)
            return
        if body is None:  # the client left (the access record says 499)
            return
        if len(body) > self.limit:
            await shaped(self._too_large(), scope["path"])(scope, receive, send)
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

    async def _read(self, receive: Receive, held: _Held) -> bytes | None:
        """The whole body (or its first bytes past the limit); None: disconnected."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body = message.get("body", b"")
            size += len(body)
            if not held.grow(size):  # past a declared length, or none was declared
                raise _OverBudget
            chunks.append(body)
            if size > self.limit or not message.get("more_body", False):
                return b"".join(chunks)


class _OverBudget(Exception):
    pass


class _Held:
    """One body's share of the budget: grown to the bytes it holds, given back once."""

    def __init__(self, budget: BodyBudget) -> None:
        self.budget = budget
        self.size = 0

    def grow(self, size: int) -> bool:
        if size <= self.size:
            return True
        if not self.budget.take(size - self.size):
            return False
        self.size = size
        return True

    def release(self) -> None:
        self.budget.give(self.size)
        self.size = 0


def _over_budget() -> ServiceUnavailable:
    return ServiceUnavailable(
        "the server holds as many request bodies as it may ([server] max_body_bytes_total); "
        "retry shortly",
        code="bodies_over_budget",
        headers={"Retry-After": "1"},
    )


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
