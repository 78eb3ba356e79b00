"""Connecting to an MCP server that does not answer (fake engine; a real socket that
accepts connections and never replies): concurrent requests share one connect attempt
and all fail within about one connect timeout, a failure is remembered for
mcp.connect_retry_s, then tried again; a server that comes back is used."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes import FakeEngine
from tests.helpers.mcp.leaks import mcp_tasks, settles
from tests.helpers.mcp.servers import http_mcp
from tests.helpers.mcp_app import call, mcp_client
from tests.kvserve_process import free_port
from tests.server.api.test_openai_api import MODEL

TIMEOUT_S = 1.0
TOOL = {"type": "mcp", "server_label": "mute", "require_approval": "never"}


class Mute:
    """A TCP server that accepts connections and never answers; counts them."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                self.accepted.append(conn)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept (close alone does not)
        self.sock.close()
        for conn in self.accepted:
            conn.close()
        self._thread.join(5)


@pytest.fixture
def mute() -> Iterator[Mute]:
    server = Mute()
    try:
        yield server
    finally:
        server.close()


def entries(url: str) -> list[dict[str, Any]]:
    return [{"label": "mute", "url": url}]


async def listing_error(client: httpx.AsyncClient) -> tuple[float, str]:
    """One request naming the server: how long it took, and its listing's error."""
    began = time.monotonic()
    r = await client.post("/v1/responses", json={"model": MODEL, "input": "hi", "tools": [TOOL]})
    assert r.status_code == 200, r.text
    listed = r.json()["output"][0]
    assert listed["type"] == "mcp_list_tools" and listed["tools"] == []
    return time.monotonic() - began, listed["error"]


async def test_concurrent_requests_share_one_connect_attempt(mute: Mute) -> None:
    url = f"http://127.0.0.1:{mute.port}/mcp"
    fake = FakeEngine(n_ctx=16384, n_seq_max=16, max_queue=16)
    async with mcp_client(fake, entries(url), connect_timeout_s=TIMEOUT_S,
                          connect_retry_s=60.0) as client:  # fmt: skip
        k = 8
        began = time.monotonic()
        results = await asyncio.gather(*[listing_error(client) for _ in range(k)])
        wall = time.monotonic() - began
        # one attempt for all of them, not one each in turn (that took k x the timeout)
        assert wall < k / 2 * TIMEOUT_S, [round(t, 2) for t, _ in results]
        assert all(f"no answer within {TIMEOUT_S:g} s" in error for _, error in results)
        assert len(mute.accepted) == 1
        # remembered: the next request fails at once, without a new attempt (which
        # would wait out the connect timeout)
        took, error = await listing_error(client)
        assert took < TIMEOUT_S and "not tried again for" in error, (took, error)
        assert len(mute.accepted) == 1
        assert await settles(lambda: len(mcp_tasks()), 0) == 0, mcp_tasks()


async def test_a_failure_is_tried_again_after_the_retry_time(mute: Mute, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{mute.port}/mcp"
    fake = FakeEngine(n_ctx=16384)
    async with mcp_client(fake, entries(url), connect_timeout_s=TIMEOUT_S,
                          connect_retry_s=0.5) as client:  # fmt: skip
        await listing_error(client)
        await asyncio.sleep(0.6)
        took, error = await listing_error(client)
        assert took >= TIMEOUT_S * 0.9 and "no answer within" in error, (took, error)
        assert len(mute.accepted) == 2


async def test_a_server_that_comes_back_is_used(tmp_path: Path) -> None:
    """Refused (nothing listens), then up on that port: past the retry time it is used."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    fake = FakeEngine(n_ctx=16384)
    # A refusal is not waited out: with a 10 s connect timeout it fails well before it
    # (the bound leaves room for a loaded 2-core machine; a 1 s timeout did not).
    timeout_s = 10.0
    with contextlib.ExitStack() as later:  # the server outlives the app (its clean close)
        async with mcp_client(fake, entries(url), connect_timeout_s=timeout_s,
                              connect_retry_s=0.3) as client:  # fmt: skip
            took, error = await listing_error(client)
            assert "unavailable" in error and took < timeout_s / 2, (took, error)
            later.enter_context(http_mcp(tmp_path, port=port))
            await asyncio.sleep(0.3)
            fake.replies = [call("add", '{"a": 1, "b": 2}'), "3"]
            r = await client.post("/v1/responses", json={
                "model": MODEL, "input": "1 + 2?", "tools": [TOOL],
                "tool_choice": {"type": "mcp", "server_label": "mute", "name": "add"}})
            assert r.status_code == 200, r.text
            assert r.json()["output"][1]["output"] == "3", r.text


async def test_a_request_that_leaves_while_connecting_leaves_nothing(mute: Mute) -> None:
    """Its own connection (headers) is still connecting when the client goes: the
    attempt is ended and the connection released, not left to finish on its own."""
    url = f"http://127.0.0.1:{mute.port}/mcp"
    fake = FakeEngine(n_ctx=16384)
    async with mcp_client(fake, entries(url), connect_timeout_s=30.0) as client:
        manager = client._transport.app.state.mcp  # type: ignore[attr-defined]
        own = {**TOOL, "headers": {"X-Team": "red"}}
        task = asyncio.ensure_future(client.post("/v1/responses", json={
            "model": MODEL, "input": "hi", "tools": [own]}))  # fmt: skip
        assert await settles(lambda: len(mute.accepted), 1) == 1  # it is connecting
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await settles(lambda: manager.num_private, 0, timeout=3) == 0
        assert await settles(lambda: len(mcp_tasks()), 0, timeout=3) == 0, mcp_tasks()
    assert fake.submitted == []
