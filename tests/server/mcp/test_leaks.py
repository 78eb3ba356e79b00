"""What an MCP request opens is closed on every way out (fake engine, real MCP servers):
requests refused after naming their servers, with headers of their own, leave no
connection task, TCP connection or child process behind; a long X-Kvserve-Session is a 400
naming the header on every route; `headers` on a stdio server are refused; connections
with a request's own headers are bounded (mcp.max_private_connections)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes import FakeEngine
from tests.helpers.mcp.leaks import child_processes, mcp_tasks, settles, tcp_connections
from tests.helpers.mcp.servers import HttpMcp
from tests.helpers.mcp_app import call, mcp_client, mcp_fixtures, servers
from tests.server.api.test_openai_api import MODEL

BETA = {"anthropic-beta": "mcp-client-2025-04-04", "anthropic-version": "2023-06-01"}
OWN = {"type": "mcp", "server_label": "tools", "require_approval": "never",
       "headers": {"X-Team": "red"}}  # fmt: skip
LONG = "s" * 129  # one past the 128 characters of a session id

mcp_http, fake, client = mcp_fixtures()


def port(server: HttpMcp) -> int:
    return int(server.url.rsplit(":", 1)[1].split("/")[0])


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}


def refused_after_naming(url: str) -> list[tuple[str, dict[str, Any], dict[str, str], str]]:
    """Requests with their own headers that are refused (400) by a check that today's
    code makes after it opened and listed their servers: path, body, headers, the field."""
    anthropic = [{"type": "url", "url": url, "name": "t", "authorization_token": "tok"}]
    return [
        ("/v1/messages", {"model": MODEL, "max_tokens": 10, "mcp_servers": anthropic,
                          "messages": [{"role": "tool", "content": "x"}]},
         BETA, "messages[0].role"),
        ("/v1/responses", {"model": MODEL, "input": "hi", "tools": [OWN]},
         {"X-Kvserve-Session": LONG}, "X-Kvserve-Session"),
        ("/v1/chat/completions", chat(tools=[OWN]), {"X-Kvserve-Session": LONG}, "X-Kvserve-Session"),
        ("/v1/chat/completions", chat(tools=[OWN], session_id="two words"), {}, "session_id"),
        # these need the listing: refused after it, and closed all the same
        ("/v1/chat/completions", chat(tools=[OWN], tool_choice={
            "type": "mcp", "server_label": "tools", "name": "nope"}), {}, "tool_choice.name"),
        ("/v1/responses", {"model": MODEL, "tools": [OWN], "input": [
            {"type": "mcp_approval_response", "approval_request_id": "mcpr_x", "approve": True}]},
         {}, "input[0].approval_request_id"),
    ]  # fmt: skip


async def no_leaks(client: httpx.AsyncClient, server: HttpMcp) -> None:
    manager = client._transport.app.state.mcp  # type: ignore[attr-defined]
    assert await settles(lambda: len(mcp_tasks()), 0) == 0, mcp_tasks()
    assert await settles(lambda: tcp_connections(port(server)), 0) == 0
    # released when close() returns, in the closing task: after its owner task and socket
    assert await settles(lambda: manager.num_private, 0) == 0


@pytest.mark.parametrize("case", range(6))
async def test_requests_refused_after_naming_their_servers_leak_nothing(
    client: httpx.AsyncClient, fake: FakeEngine, mcp_http: HttpMcp, case: int
) -> None:
    path, body, headers, param = refused_after_naming(mcp_http.url)[case]
    children = set(child_processes())
    for _ in range(5):
        r = await client.post(path, json=body, headers=headers)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error.get("param") == param or error["message"].startswith(param), r.text
    assert fake.submitted == []
    await no_leaks(client, mcp_http)
    assert set(child_processes()) == children


@pytest.mark.parametrize("stream", [False, True])
async def test_requests_with_their_own_headers_close_their_connections(
    client: httpx.AsyncClient, fake: FakeEngine, mcp_http: HttpMcp, stream: bool
) -> None:
    fake.reply = call("header", '{"name": "X-Team"}').encode()
    anthropic = [{"type": "url", "url": mcp_http.url, "name": "t", "authorization_token": "a"}]
    for _ in range(3):
        for path, body, headers in [
            ("/v1/responses", {"model": MODEL, "input": "hi", "tools": [OWN]}, {}),
            ("/v1/chat/completions", chat(tools=[OWN]), {}),
            ("/v1/messages", {"model": MODEL, "max_tokens": 50, "mcp_servers": anthropic,
                              "messages": [{"role": "user", "content": "hi"}]}, BETA),
        ]:  # fmt: skip
            r = await client.post(path, json={**body, "stream": stream}, headers=headers)
            assert r.status_code == 200, r.text
            assert "red" in r.text or path == "/v1/messages"  # the header reached the server
    await no_leaks(client, mcp_http)


ROUTES = [
    ("/v1/chat/completions", chat()),
    ("/v1/chat/completions", chat(tools=[OWN])),
    ("/v1/completions", {"model": MODEL, "prompt": "hi"}),
    ("/v1/responses", {"model": MODEL, "input": "hi"}),
    ("/v1/responses", {"model": MODEL, "input": "hi", "tools": [OWN]}),
    ("/v1/messages", {"model": MODEL, "max_tokens": 10,
                      "messages": [{"role": "user", "content": "hi"}]}),
    ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}),
    ("/api/generate", {"model": MODEL, "prompt": "hi"}),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body"), ROUTES)
@pytest.mark.parametrize("value", [LONG, "two words"])
async def test_a_bad_session_header_is_400_naming_it(
    client: httpx.AsyncClient, fake: FakeEngine, mcp_http: HttpMcp, path: str,
    body: dict[str, Any], value: str,
) -> None:  # fmt: skip
    r = await client.post(path, json=body, headers={"X-Kvserve-Session": value, **BETA})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    if isinstance(error, str):  # Ollama's shape
        assert error.startswith("X-Kvserve-Session: a session id is 1 to 128 characters"), r.text
    elif "param" in error:  # OpenAI's
        assert error["param"] == "X-Kvserve-Session", r.text
    else:  # Anthropic's
        assert error["message"].startswith("X-Kvserve-Session: "), r.text
    assert fake.submitted == []
    await no_leaks(client, mcp_http)
    # the longest session id there may be is a session as before
    r = await client.post(path, json=body, headers={"X-Kvserve-Session": "s" * 128, **BETA})
    assert r.status_code == 200, r.text
    assert fake.submitted[-1].session_id == "s" * 128


@pytest.mark.parametrize(("tool", "param"), [
    ({"headers": {"X-Team": "red"}}, "tools[0].headers"),
    ({"authorization": "tok"}, "tools[0].authorization"),
])  # fmt: skip
async def test_headers_for_a_stdio_server_are_refused(
    client: httpx.AsyncClient, fake: FakeEngine, tool: dict[str, Any], param: str
) -> None:
    before = set(child_processes())
    local = {"type": "mcp", "server_label": "local", "require_approval": "never", **tool}
    for path, body in [("/v1/responses", {"model": MODEL, "input": "hi", "tools": [local]}),
                       ("/v1/chat/completions", chat(tools=[local]))]:  # fmt: skip
        rs = await asyncio.gather(*[client.post(path, json=body) for _ in range(5)])
        for r in rs:
            assert r.status_code == 400, r.text
            assert r.json()["error"]["param"] == param
            assert "stdio" in r.json()["error"]["message"]
    assert set(child_processes()) == before  # no server process was started for them
    assert fake.submitted == []


async def test_private_connections_are_bounded(mcp_http: HttpMcp, tmp_path: Path) -> None:
    fake = FakeEngine(n_ctx=16384, n_seq_max=32, max_queue=32)
    tag = f"bound-{tmp_path.name}"
    fake.reply = call("slow", f'{{"seconds": 1.0, "tag": "{tag}"}}').encode()
    entries = servers(mcp_http.url, tmp_path / "stdio.log")
    async with mcp_client(fake, entries, max_private_connections=4,
                          max_tool_iterations=1) as client:  # fmt: skip
        body = {"model": MODEL, "input": "hi", "tools": [OWN]}
        rs = await asyncio.gather(*[client.post("/v1/responses", json=body) for _ in range(20)])
        codes = [r.status_code for r in rs]
        assert 1 <= codes.count(200) <= 4 and codes.count(429) == 20 - codes.count(200), codes
        refused = next(r for r in rs if r.status_code == 429)
        assert "mcp.max_private_connections" in refused.json()["error"]["message"]
        assert refused.headers["retry-after"] == "1"
        # what the MCP server saw: never more than 4 of these calls at once
        running = peak = 0
        for line in mcp_http.lines():
            if line.endswith(tag):
                running += 1 if line.startswith("start") else -1
                peak = max(peak, running)
        assert 1 <= peak <= 4, mcp_http.lines()
        await no_leaks(client, mcp_http)
        # the bound is of connections open now: once closed, requests get theirs again
        r = await client.post("/v1/responses", json=body)
        assert r.status_code == 200, r.text
        await no_leaks(client, mcp_http)
