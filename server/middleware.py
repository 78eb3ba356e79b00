"""ASGI middleware: request body size limit."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.errors import PayloadTooLarge


class BodyLimit:
    """Refuse request bodies over `limit` bytes with 413, before the app parses them.

    The body is read here (our bodies are JSON documents, read whole anyway) and
    replayed to the app; later `receive()` calls pass through, so the app still sees
    the client's disconnect."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.limit:
                await self._refuse(scope, receive, send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replay: Message | None = {
            "type": "http.request",
            "body": b"".join(chunks),
            "more_body": False,
        }

        async def replayed() -> Message:
            nonlocal replay
            if replay is not None:
                message, replay = replay, None
                return message
            return await receive()

        await self.app(scope, replayed, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = PayloadTooLarge(
            f"the request body exceeds the limit of {self.limit} bytes", code="body_too_large"
        )
        await error.response()(scope, receive, send)
