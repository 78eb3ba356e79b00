"""A logging reverse proxy: what an agent client sends to kvserve and what it gets back.

The agent programs (tests/e2e/test_agent_clients.py) are black boxes; the proxy between
them and kvserve records every exchange, so a test can say which request was refused and
with what body. Responses are passed through as they arrive (streams stay streams, at
the pace kvserve sends them), never buffered.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.helpers.threaded_server import serving_app

# Per-connection headers are the proxy's own business on each side (RFC 9110 7.6.1).
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
              "proxy-authorization", "proxy-authenticate", "host"}  # fmt: skip
# How much of each response body is kept: a whole error body, the start of a stream.
KEPT_BYTES = 64 * 1024


@dataclass
class Exchange:
    method: str
    path: str  # with its query string
    headers: dict[str, str]
    body: bytes
    status: int = 0  # 0 until kvserve answered (or when it could not be reached)
    response: bytearray = field(default_factory=bytearray)  # its first KEPT_BYTES
    error: str = ""  # why the upstream call failed, if it did

    def json(self) -> Any:
        """The request body as JSON (None when it is not)."""
        with contextlib.suppress(ValueError):
            return json.loads(self.body)
        return None

    def summary(self) -> str:
        text = bytes(self.response[:2000]).decode(errors="replace")
        return f"{self.method} {self.path} -> {self.status} {self.error} {text}"


class LoggingProxy:
    """An ASGI app forwarding every HTTP request to `upstream` and recording it."""

    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()

    def refused(self) -> list[Exchange]:
        """The exchanges kvserve answered with a 4xx or 5xx, or never answered."""
        with self._lock:
            return [e for e in self.exchanges if not 200 <= e.status < 400]

    def requests_to(self, suffix: str) -> list[Exchange]:
        """The exchanges whose path (query string aside) ends with `suffix`."""
        with self._lock:
            return [e for e in self.exchanges if e.path.split("?")[0].endswith(suffix)]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        body = bytearray()
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        path = scope["raw_path"].decode() + (
            "?" + scope["query_string"].decode() if scope["query_string"] else ""
        )
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        exchange = Exchange(scope["method"], path, headers, bytes(body))
        with self._lock:
            self.exchanges.append(exchange)
        forwarded = {k: v for k, v in headers.items() if k not in HOP_BY_HOP}
        # A client per request: the proxy runs in uvicorn's thread and loop, and a
        # per-request client leaves nothing open between tests.
        async with httpx.AsyncClient(timeout=httpx.Timeout(None)) as client:
            request = client.build_request(
                scope["method"], self.upstream + path, headers=forwarded, content=bytes(body)
            )
            try:
                upstream = await client.send(request, stream=True)
            except httpx.HTTPError as e:
                exchange.status, exchange.error = 502, f"upstream: {e!r}"
                await _answer(send, 502, b'{"error": "kvserve unreachable"}')
                return
            try:
                exchange.status = upstream.status_code
                out = [(k.encode(), v.encode()) for k, v in upstream.headers.multi_items()
                       if k.lower() not in HOP_BY_HOP]  # fmt: skip
                await send({"type": "http.response.start", "status": upstream.status_code,
                            "headers": out})  # fmt: skip
                async for chunk in upstream.aiter_raw():
                    if len(exchange.response) < KEPT_BYTES:
                        exchange.response += chunk[: KEPT_BYTES - len(exchange.response)]
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
            finally:
                await upstream.aclose()


async def _answer(send: Any, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@contextlib.contextmanager
def logging_proxy(upstream: str) -> Iterator[tuple[str, LoggingProxy]]:
    """The proxy's URL and the proxy (its record) while it runs in front of `upstream`."""
    proxy = LoggingProxy(upstream)
    with serving_app(proxy) as url:
        yield url, proxy
