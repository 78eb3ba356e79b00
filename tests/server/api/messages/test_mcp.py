"""Anthropic's MCP connector (`mcp_servers`, beta mcp-client-2025-04-04) on the fake engine
against a real MCP server: mcp_tool_use / mcp_tool_result blocks, streamed whole."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.fakes import FakeEngine
from tests.helpers.mcp.servers import HttpMcp
from tests.helpers.mcp_app import call, mcp_fixtures
from tests.server.api.responses.test_responses import named_events
from tests.server.api.test_openai_api import MODEL

ADD = call("add", '{"a": 1, "b": 1}')
BETA = {"anthropic-beta": "mcp-client-2025-04-04", "anthropic-version": "2023-06-01"}


mcp_http, fake, client = mcp_fixtures()


def req(url: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 200,
            "messages": [{"role": "user", "content": "1 + 1?"}],
            "mcp_servers": [{"type": "url", "url": url, "name": "calc"}], **extra}  # fmt: skip


async def test_mcp_blocks_before_the_answer(
    client: httpx.AsyncClient, fake: FakeEngine, mcp_http: HttpMcp
) -> None:
    fake.replies = [ADD, "Two."]
    r = await client.post("/v1/messages", headers=BETA, json=req(
        mcp_http.url, tool_choice={"type": "tool", "name": "add"}))
    assert r.status_code == 200, r.text
    body = r.json()
    use, result, text = body["content"]
    assert use["type"] == "mcp_tool_use" and use["id"].startswith("mcptoolu_")
    assert (use["name"], use["server_name"], use["input"]) == ("add", "calc", {"a": 1, "b": 1})
    assert result == {"type": "mcp_tool_result", "tool_use_id": use["id"], "is_error": False,
                      "content": [{"type": "text", "text": "2"}]}
    assert text == {"type": "text", "text": "Two."}
    assert body["stop_reason"] == "end_turn"
    first, second = fake.submitted
    assert first.session_id == second.session_id
    usage = body["usage"]
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == (
        len(first.prompt_tokens) + len(second.prompt_tokens))


async def test_stream(client: httpx.AsyncClient, fake: FakeEngine, mcp_http: HttpMcp) -> None:
    fake.replies = [call("boom"), "It broke."]
    r = await client.post("/v1/messages", headers=BETA, json=req(
        mcp_http.url, stream=True, tool_choice={"type": "any"}))
    events = named_events(r.text)
    names = [n for n, _ in events]
    assert names[:2] == ["message_start", "ping"]
    assert names[2:8] == ["content_block_start", "content_block_delta", "content_block_stop",
                          "content_block_start", "content_block_stop", "content_block_start"]
    assert events[2][1]["content_block"]["type"] == "mcp_tool_use"
    assert events[2][1]["content_block"]["input"] == {}
    assert events[3][1]["delta"] == {"type": "input_json_delta", "partial_json": "{}"}
    result = events[5][1]["content_block"]
    assert result["type"] == "mcp_tool_result" and result["is_error"] is True
    assert [e["index"] for n, e in events if n == "content_block_start"] == [0, 1, 2]
    assert names[-2:] == ["message_delta", "message_stop"]


@pytest.mark.parametrize(("servers_", "headers", "param"), [
    ([{"type": "url", "url": "http://10.0.0.1/mcp", "name": "x"}], BETA, "mcp_servers[0].url"),
    ([{"type": "url", "name": "x"}], BETA, "mcp_servers[0].url"),
    ([{"type": "sse", "url": "u", "name": "x"}], BETA, "mcp_servers[0].type"),
    ([{"type": "url", "url": "u", "name": "x", "tool_configuration": {"enabled": "yes"}}], BETA,
     "mcp_servers[0].tool_configuration.enabled"),
    ("not a list", BETA, "mcp_servers"),
    (None, {"anthropic-version": "2023-06-01"}, "mcp_servers"),
])  # fmt: skip
async def test_bad_input_is_400(client: httpx.AsyncClient, fake: FakeEngine, mcp_http: HttpMcp,
                                servers_: Any, headers: dict[str, str], param: str) -> None:
    body = req(mcp_http.url)
    if servers_ is not None:
        body["mcp_servers"] = servers_
    r = await client.post("/v1/messages", headers=headers, json=body)
    assert r.status_code == 400, r.text
    error = r.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"].startswith(param) or param in error["error"]["message"]
    assert fake.submitted == []


async def test_disabled_server_is_not_contacted(
    client: httpx.AsyncClient, fake: FakeEngine, mcp_http: HttpMcp
) -> None:
    fake.replies = ["Plain."]
    body = req(mcp_http.url)
    body["mcp_servers"][0]["tool_configuration"] = {"enabled": False}
    r = await client.post("/v1/messages", headers=BETA, json=body)
    assert r.json()["content"] == [{"type": "text", "text": "Plain."}]
    assert json.dumps(fake.submitted[0].prompt_tokens) and "add" not in bytes(
        fake.submitted[0].prompt_tokens).decode()
