"""What kvserve sends an MCP server besides the call (fake engine, real MCP servers on
streamable HTTP and SSE): configured `headers` and `bearer_token_env`, and a request's own
`headers` / `authorization` (Responses) and `authorization_token` (Anthropic), which get a
connection of their own and leave the shared one as configured; bad values refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from server.config.mcp import mcp_servers
from server.config.tree import ConfigError, load_settings
from tests.fakes import FakeEngine
from tests.helpers.mcp.servers import HttpMcp, http_mcp
from tests.helpers.mcp_app import call, mcp_client
from tests.server.api.test_openai_api import MODEL

TOKEN_ENV = "KVSERVE_TEST_MCP_TOKEN"
WHO = [call("whoami"), call("header", '{"name": "X-Team"}'), "Done."]


@pytest.fixture(scope="module", params=["http", "sse"])
def mcp_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[HttpMcp]:  # fmt: skip
    with http_mcp(tmp_path_factory.mktemp("mcp"), request.param) as server:
        yield server


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine(n_ctx=16384)


def entry(server: HttpMcp, **extra: Any) -> list[dict[str, Any]]:
    transport = "sse" if server.url.endswith("/sse") else "streamable_http"
    return [{"label": "tools", "url": server.url, "transport": transport, **extra}]


def req(**tool: Any) -> dict[str, Any]:
    tools = [{"type": "mcp", "server_label": "tools", "require_approval": "never", **tool}]
    return {"model": MODEL, "input": "who am I?", "tools": tools, "tool_choice": "required"}


def outputs(body: dict[str, Any]) -> dict[str, str]:
    return {i["name"]: i["output"] for i in body["output"] if i["type"] == "mcp_call"}


async def who(client: httpx.AsyncClient, fake: FakeEngine, **tool: Any) -> dict[str, str]:
    """What the MCP server saw of one Responses request that calls `whoami` and
    `header` (the `mcp` tool entry with `tool`'s extra fields)."""
    fake.replies = list(WHO)
    r = await client.post("/v1/responses", json=req(**tool))
    assert r.status_code == 200, r.text
    return outputs(r.json())


async def test_configured_and_request_headers_reach_the_server(
    fake: FakeEngine, mcp_server: HttpMcp, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, "s3cret")
    servers = entry(mcp_server, headers={"X-Team": "blue"}, bearer_token_env=TOKEN_ENV)
    async with mcp_client(fake, servers, max_tool_iterations=2) as client:
        # the shared connection opens first, with the configured headers and token
        assert await who(client, fake) == {"whoami": "Bearer s3cret", "header": "blue"}
        # the request's headers win over the configured ones
        own = {"X-Team": "red", "Authorization": "Bearer mine"}
        assert await who(client, fake, headers=own) == {"whoami": "Bearer mine", "header": "red"}
        # OpenAI's `authorization`: the OAuth token, as Bearer
        got = await who(client, fake, authorization="tok-1")
        assert got == {"whoami": "Bearer tok-1", "header": "blue"}
        # the shared connection is as configured still
        assert await who(client, fake) == {"whoami": "Bearer s3cret", "header": "blue"}


async def test_anthropic_authorization_token_reaches_the_server(
    fake: FakeEngine, mcp_server: HttpMcp
) -> None:
    async with mcp_client(fake, entry(mcp_server)) as client:
        fake.replies = [call("whoami"), "Done."]
        body = {"model": MODEL, "max_tokens": 100,
                "messages": [{"role": "user", "content": "who?"}],
                "tool_choice": {"type": "tool", "name": "whoami"},
                "mcp_servers": [{"type": "url", "url": mcp_server.url, "name": "t",
                                 "authorization_token": "ant-tok"}]}  # fmt: skip
        r = await client.post("/v1/messages", json=body, headers={
            "anthropic-beta": "mcp-client-2025-04-04", "anthropic-version": "2023-06-01"})
        assert r.status_code == 200, r.text
        result = r.json()["content"][1]
        assert result["type"] == "mcp_tool_result"
        assert result["content"] == [{"type": "text", "text": "Bearer ant-tok"}]


@pytest.mark.parametrize(("tool", "param"), [
    ({"headers": {"X Bad": "v"}}, "tools[0].headers"),
    ({"headers": {"X-Ok": "a\r\nInjected: 1"}}, "tools[0].headers"),
    ({"headers": ["X-Team"]}, "tools[0].headers"),
    ({"authorization": "tok\nX: y"}, "tools[0].authorization"),
    ({"authorization": 5}, "tools[0].authorization"),
])  # fmt: skip
async def test_bad_request_headers_are_400_naming_the_field(
    fake: FakeEngine, mcp_server: HttpMcp, tool: dict[str, Any], param: str
) -> None:
    async with mcp_client(fake, entry(mcp_server)) as client:
        r = await client.post("/v1/responses", json=req(**tool))
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param
        r = await client.post("/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "hi"}],
            "tools": req(**tool)["tools"]})  # fmt: skip
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert fake.submitted == []


def test_a_missing_token_variable_stops_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    cfg = tmp_path / "k.toml"
    cfg.write_text(f'[[mcp_servers]]\nlabel = "t"\nurl = "http://127.0.0.1:9/mcp"\n'
                   f'bearer_token_env = "{TOKEN_ENV}"\n')  # fmt: skip
    with pytest.raises(ConfigError, match=f"mcp_servers\\[0\\].bearer_token_env: the "
                       f"environment variable '{TOKEN_ENV}' is not set"):  # fmt: skip
        load_settings(str(cfg), env={})
    monkeypatch.setenv(TOKEN_ENV, "")
    with pytest.raises(ConfigError, match="is not set"):
        load_settings(str(cfg), env={})
    monkeypatch.setenv(TOKEN_ENV, "x")
    assert load_settings(str(cfg), env={}).mcp_servers[0].http_headers() == {
        "Authorization": "Bearer x"}


@pytest.mark.parametrize(("extra", "message"), [
    ({"headers": {"Bad Name": "v"}}, "mcp_servers[0].headers: 'Bad Name' is not a valid"),
    ({"headers": {"X": "a\nb"}}, "mcp_servers[0].headers: the value of 'X' has a line break"),
    ({"command": "python", "url": "", "headers": {"X": "a"}}, "mcp_servers[0].headers: only"),
    ({"command": "python", "url": "", "bearer_token_env": "HOME"},
     "mcp_servers[0].bearer_token_env: only for an HTTP server"),
    ({"transport": "websocket"}, "mcp_servers[0].transport"),
])  # fmt: skip
def test_bad_server_entries_name_the_key(extra: dict[str, Any], message: str) -> None:
    raw = {"label": "t", "url": "http://127.0.0.1:9/mcp", **extra}
    with pytest.raises(ConfigError) as err:
        mcp_servers([{k: v for k, v in raw.items() if v != ""}])
    assert message in str(err.value)

