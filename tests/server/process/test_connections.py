"""Connection bounds on a real uvicorn server over raw sockets (issue 17, item 3): a
stalled request body and a slow head of a later keep-alive request are cut off within
their timeouts; clients within them are served. (A body without a key is never read:
tests/server/http/test_key_first.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator

import pytest
import uvicorn

from server.app import create_app
from server.config.tree import AuthSection, ServerSection, Settings
from server.process.serve import uvicorn_config
from tests.fakes import FakeEngine

HEAD_S = 1.0  # server.header_timeout_s
BODY_S = 1.0  # server.body_timeout_s
SLACK_S = 3.0  # a busy machine
KEY = "sk-test"
AUTH = b"Authorization: Bearer " + KEY.encode() + b"\r\n"


@pytest.fixture
async def port() -> AsyncIterator[int]:
    """kvserve's app (a fake engine) under uvicorn as `serve` configures it, on a free
    port; keep-alive far longer than the head timeout, so that it is not what closes."""
    server_section = dataclasses.replace(
        ServerSection(), port=0, header_timeout_s=HEAD_S, body_timeout_s=BODY_S, keep_alive_s=60
    )
    settings = Settings(server=server_section, auth=AuthSection(api_keys=(KEY,)))
    app = create_app(settings, engine=FakeEngine())
    server = uvicorn.Server(uvicorn_config(app, settings))
    task = asyncio.create_task(server.serve())
    while not server.started:
        assert not task.done(), task
        await asyncio.sleep(0.01)
    yield int(server.servers[0].sockets[0].getsockname()[1])
    server.should_exit = True
    await task


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def _response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One response: its status and its body (by Content-Length)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), SLACK_S)
    lines = head.decode("latin-1").split("\r\n")
    length = next(int(line.split(":")[1]) for line in lines if line.lower().startswith("content-length:"))
    return int(lines[0].split()[1]), await reader.readexactly(length)


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> float:
    """Seconds until the server closes the connection (reading what it still sends)."""
    start = time.monotonic()
    try:
        while await asyncio.wait_for(reader.read(65536), seconds):
            pass
    except ConnectionResetError:
        pass  # reset by the server: closed too
    return time.monotonic() - start


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


async def test_a_stalled_body_gets_408_and_the_connection_closed(port: int) -> None:
    reader, writer = await _connect(port)
    try:
        # A complete head, half a body.
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n" + AUTH +
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\": "
        )
        await writer.drain()
        start = time.monotonic()
        status, body = await _response(reader)
        assert status == 408 and b'"code":"body_timeout"' in body
        assert BODY_S - 0.2 <= time.monotonic() - start <= BODY_S + SLACK_S
        assert await _closed_within(reader, SLACK_S) < SLACK_S
    finally:
        await _close(writer)


async def test_a_body_within_the_timeout_reaches_the_app(port: int) -> None:
    reader, writer = await _connect(port)
    try:
        body = b'{"model": "fake-model", "messages": []}'
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n" + AUTH
                     + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
                     + body[:10])  # fmt: skip
        await writer.drain()
        await asyncio.sleep(BODY_S / 2)
        writer.write(body[10:])
        await writer.drain()
        status, _ = await _response(reader)
        assert status == 400  # the app's answer: no messages
    finally:
        await _close(writer)


@pytest.mark.parametrize("trickle", [False, True])
async def test_a_slow_head_of_a_later_request_closes_the_connection(
    port: int, trickle: bool
) -> None:
    reader, writer = await _connect(port)

    async def send_a_byte_at_a_time() -> None:
        while trickle and not reader.at_eof() and not writer.is_closing():
            writer.write(b"X")  # a header line that never ends
            await asyncio.sleep(0.1)

    try:
        writer.write(b"GET /livez HTTP/1.1\r\nHost: localhost\r\n\r\n")
        await writer.drain()
        assert (await _response(reader))[0] == 200
        writer.write(b"GET /livez HTTP/1.1\r\nHost: localhost\r\n")  # the next head, incomplete
        sending = asyncio.create_task(send_a_byte_at_a_time())
        try:
            waited = await _closed_within(reader, HEAD_S + SLACK_S)
        finally:
            sending.cancel()
        assert waited >= HEAD_S - 0.2  # the head timeout, not anything sooner
    finally:
        await _close(writer)


async def test_an_idle_keep_alive_connection_outlives_the_head_timeout(port: int) -> None:
    reader, writer = await _connect(port)
    try:
        for _ in range(2):
            writer.write(b"GET /livez HTTP/1.1\r\nHost: localhost\r\n\r\n")
            await writer.drain()
            assert (await _response(reader))[0] == 200
            await asyncio.sleep(HEAD_S + 0.5)  # idle: keep_alive_s applies, not the head timeout
    finally:
        await _close(writer)
