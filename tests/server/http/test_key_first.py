"""The key before the body (server/http/key_first.py): a request without a valid key is
answered 401, in its API's shape, before one byte of its body is received; the bytes
of bodies held at once are bounded (server/http/bodies.py); a client that leaves before
its answer is a 499, not a 500."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families
from starlette.types import Message, Receive, Scope, Send

from server.app import create_app
from server.config.tree import AuthSection, ServerSection, Settings
from server.http.bodies import BodyBudget, BodyLimit
from server.process.serve import uvicorn_config
from tests.fakes import FakeEngine

KEY = "sk-key-first"
# Invalid JSON of the shape that cost the most to parse ([{},{},...]): what is read of
# it, and whether it is parsed, is what the tests look at.
BODY = b"[" + b"{}," * 20_000 + b"{}"  # no closing bracket


def settings(**server: Any) -> Settings:
    return Settings(
        server=dataclasses.replace(ServerSection(), **server), auth=AuthSection(api_keys=(KEY,))
    )


async def call(
    app: Any, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, bytes, int]:
    """One request straight through the ASGI app: (status, body, body messages read)."""
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    if body:
        raw.append((b"content-length", str(len(body)).encode()))
    scope: Scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                    "method": method, "path": path, "raw_path": path.encode(),
                    "query_string": b"", "root_path": "", "scheme": "http",
                    "headers": [(b"host", b"test"), *raw], "server": ("test", 80),
                    "client": ("10.0.0.1", 5000)}  # fmt: skip
    chunks = [body[i : i + 4096] for i in range(0, len(body), 4096)] or [b""]
    reads = 0
    answered = asyncio.Event()

    async def receive() -> Message:
        nonlocal reads
        if reads < len(chunks):
            reads += 1
            return {"type": "http.request", "body": chunks[reads - 1],
                    "more_body": reads < len(chunks)}  # fmt: skip
        await answered.wait()
        return {"type": "http.disconnect"}

    status, out = 0, b""

    async def send(message: Message) -> None:
        nonlocal status, out
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            out += message.get("body", b"")
            if not message.get("more_body", False):
                answered.set()

    await app(scope, receive, send)
    return status, out, reads


@pytest.fixture
def app() -> Any:
    return create_app(settings(), engine=FakeEngine())


# Routes inside the model gate, outside it (FastAPI parsed their bodies before the key
# dependency ran), model management, and a path no route has.
@pytest.mark.parametrize(
    "path,shape",
    [
        ("/v1/chat/completions", "openai"),
        ("/v1/messages", "anthropic"),
        ("/api/chat", "ollama"),
        ("/api/generate", "ollama"),
        ("/v1/sessions", "openai"),
        ("/api/show", "ollama"),
        ("/api/pull", "ollama"),
        ("/v1/cache/warm", "openai"),
        ("/tokenize", "openai"),
        ("/no/such/route", "openai"),
    ],
)
@pytest.mark.parametrize("key", [None, "sk-wrong"])
async def test_no_body_byte_is_read_without_a_valid_key(
    app: Any, path: str, shape: str, key: str | None
) -> None:
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    status, body, reads = await call(app, "POST", path, BODY, headers)
    assert status == 401
    assert reads == 0  # not one chunk received: nothing buffered, nothing parsed
    answer = json.loads(body)
    if shape == "anthropic":
        assert answer["type"] == "error" and answer["error"]["type"] == "authentication_error"
    elif shape == "ollama":
        assert isinstance(answer["error"], str) and "API key" in answer["error"]
    else:
        assert answer["error"]["code"] == "invalid_api_key"


async def test_anthropics_header_and_a_bearer_key_both_pass_and_the_body_is_read(app: Any) -> None:
    chat = (b'{"model": "fake-model", "max_tokens": 2, '
            b'"messages": [{"role": "user", "content": "hi"}]}')  # fmt: skip
    status, _, reads = await call(app, "POST", "/v1/messages", chat, {"x-api-key": KEY})
    assert (status, reads) == (200, 1)
    status, _, reads = await call(app, "POST", "/v1/chat/completions", chat,
                                  {"authorization": f"Bearer {KEY}"})  # fmt: skip
    assert (status, reads) == (200, 1)
    # With the key, the same invalid body is read and answered by the route: a 400.
    status, _, reads = await call(app, "POST", "/v1/chat/completions", BODY,
                                  {"authorization": f"Bearer {KEY}"})  # fmt: skip
    assert status == 400 and reads > 1


@pytest.mark.parametrize("path", ["/health", "/livez", "/metrics", "/", "/static/app.js"])
async def test_the_open_routes_need_no_key(app: Any, path: str) -> None:
    status, _, _ = await call(app, "GET", path)
    assert status == 200


async def test_a_get_without_a_key_is_refused_too(app: Any) -> None:
    assert (await call(app, "GET", "/v1/models"))[0] == 401
    assert (await call(app, "GET", "/v1/models", headers={"x-api-key": KEY}))[0] == 200


# -- over a real socket: the answer comes before the body ---------------------------


@pytest.fixture
async def port() -> AsyncIterator[int]:
    the_settings = settings(port=0, body_timeout_s=5.0, header_timeout_s=1.0, keep_alive_s=1.0)
    server = uvicorn.Server(uvicorn_config(create_app(the_settings, engine=FakeEngine()),
                                           the_settings))  # fmt: skip
    task = asyncio.create_task(server.serve())
    while not server.started:
        assert not task.done(), task
        await asyncio.sleep(0.01)
    yield int(server.servers[0].sockets[0].getsockname()[1])
    server.should_exit = True
    await task


async def test_the_401_comes_before_the_body_is_sent(port: int) -> None:
    """A head announcing 8 MB, and no body byte: the old order waited for the body
    (body_timeout_s, then 408); the key is checked on the head alone."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        start = time.monotonic()
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 8000000\r\n\r\n")  # fmt: skip
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3.0)
        assert head.startswith(b"HTTP/1.1 401") and time.monotonic() - start < 3.0
        # The body is never awaited: the connection is closed once idle (keep_alive_s).
        answered = time.monotonic()
        while await asyncio.wait_for(reader.read(65536), 4.0):
            pass
        assert time.monotonic() - answered < 4.0
    finally:
        writer.close()


# -- the bytes of all bodies held at once -------------------------------------------


async def test_bodies_in_flight_are_bounded_and_given_back() -> None:
    held_by_app: list[int] = []
    release = asyncio.Event()
    budget = BodyBudget(3000)

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        held_by_app.append(budget.held)
        await release.wait()  # the route holds its body until it answers
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    limit = BodyLimit(route, limit=2048, timeout_s=5.0, budget=budget)
    first = asyncio.create_task(call(limit, "POST", "/v1/chat/completions", b"x" * 2000))
    while not held_by_app:
        await asyncio.sleep(0.01)
    assert held_by_app == [2000]
    # A second declared body does not fit: refused before it is read.
    status, body, reads = await call(limit, "POST", "/v1/chat/completions", b"y" * 1500)
    assert (status, reads) == (503, 0) and b"bodies_over_budget" in body
    # In Anthropic's shape on its route.
    status, body, _ = await call(limit, "POST", "/v1/messages", b"y" * 1500)
    assert status == 503 and b"overloaded_error" in body
    release.set()
    assert (await first)[0] == 200
    assert budget.held == 0
    # Room again.
    assert (await call(limit, "POST", "/v1/chat/completions", b"z" * 1500))[0] == 200
    assert budget.held == 0


async def test_a_body_without_a_length_is_counted_as_it_arrives() -> None:
    budget = BodyBudget(1500)
    budget.take(1000)  # another body holds this much

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        raise AssertionError("not reached")

    limit = BodyLimit(route, limit=2048, timeout_s=5.0, budget=budget)
    received = 0

    async def receive() -> Message:  # two chunks of 300 bytes
        nonlocal received
        received += 1
        return {"type": "http.request", "body": b"x" * 300, "more_body": received == 1}

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions",
             "headers": [(b"transfer-encoding", b"chunked")]}  # fmt: skip
    await limit(scope, receive, send)
    assert sent[0]["status"] == 503 and received == 2  # the second chunk passed the budget
    assert budget.held == 1000  # its own share given back


# -- a client that leaves mid-upload ------------------------------------------------


def requests_counted(metrics_text: str, status: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(metrics_text):
        for s in family.samples:
            if s.name == "kvserve_requests_total" and s.labels.get("status") == status:
                total += s.value
    return total


async def test_a_client_that_leaves_mid_upload_is_a_499(app: Any) -> None:
    scope: Scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                    "method": "POST", "path": "/v1/chat/completions", "raw_path": b"",
                    "query_string": b"", "root_path": "", "scheme": "http",
                    "headers": [(b"host", b"test"), (b"authorization", f"Bearer {KEY}".encode()),
                                (b"content-length", b"1000")],
                    "server": ("test", 80), "client": ("10.0.0.1", 5000)}  # fmt: skip
    messages: list[Message] = [{"type": "http.request", "body": b'{"model": ', "more_body": True},
                               {"type": "http.disconnect"}]  # fmt: skip

    async def receive() -> Message:
        return messages.pop(0)

    async def send(message: Message) -> None:
        raise AssertionError(f"nobody to answer: {message}")

    await app(scope, receive, send)
    status, metrics, _ = await call(app, "GET", "/metrics")
    assert status == 200
    assert requests_counted(metrics.decode(), "499") == 1
    assert requests_counted(metrics.decode(), "500") == 0
