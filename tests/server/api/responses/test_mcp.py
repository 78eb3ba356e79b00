"""The Responses API's MCP tools on the fake engine against real MCP servers (the SDK's
server on streamable HTTP and on stdio): the loop, its items and events, failures folded
back, approvals, limits, and bad input (400 naming the field)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes import FakeEngine
from tests.helpers.mcp.servers import HttpMcp
from tests.helpers.mcp_app import call, mcp_client, mcp_fixtures, servers
from tests.server.api.responses.test_responses import named_events
from tests.server.api.test_openai_api import MODEL

ADD = call("add", '{"a": 2, "b": 3}')
NEVER = {"type": "mcp", "server_label": "tools", "require_approval": "never"}

mcp_http, fake, client = mcp_fixtures(max_tool_iterations=3, max_result_chars=1000)


def req(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": "What is 2 + 3?", "tools": [NEVER], **extra}


def force(reply: str, label: str = "tools") -> dict[str, Any]:
    """The named mcp tool_choice of the call in `reply`."""
    return {"type": "mcp", "server_label": label, "name": json.loads(reply)["tool_calls"][0]["name"]}


def prompt_text(fake: FakeEngine, n: int) -> str:
    return bytes(fake.submitted[n].prompt_tokens).decode()


async def test_forced_call_runs_in_the_server_on_one_session(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    fake.replies = [ADD, "The sum is 5."]
    r = await client.post("/v1/responses", json=req(
        tool_choice={"type": "mcp", "server_label": "tools", "name": "add"}))
    assert r.status_code == 200, r.text
    body = r.json()
    listed, called, message = body["output"]
    assert listed["type"] == "mcp_list_tools" and listed["server_label"] == "tools"
    assert "add" in [t["name"] for t in listed["tools"]] and "error" not in listed
    assert called["type"] == "mcp_call" and called["id"].startswith("mcp_")
    assert (called["name"], called["server_label"], called["status"]) == ("add", "tools",
                                                                          "completed")
    assert json.loads(called["arguments"]) == {"a": 2, "b": 3}
    assert called["output"] == "5" and called["error"] is None
    assert message["type"] == "message"
    assert message["content"][0]["text"] == "The sum is 5."
    # round 1 forced by the grammar; round 2 free; both on one session; the result is in it
    first, second = fake.submitted
    assert first.sampling.grammar is not None and not first.sampling.grammar_lazy
    assert second.sampling.grammar_lazy
    assert first.session_id is not None and first.session_id == second.session_id
    assert prompt_text(fake, 1).startswith(prompt_text(fake, 0)[:-40])
    assert "5" in prompt_text(fake, 1)[len(prompt_text(fake, 0)) - 40:]
    usage = body["usage"]
    assert usage["input_tokens"] == len(first.prompt_tokens) + len(second.prompt_tokens)
    assert usage["output_tokens"] == len(ADD) + len("The sum is 5.") + 2  # the EOS of each
    assert body["tools"][0] == NEVER


async def test_stream_sends_the_mcp_events_in_order(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    fake.replies = [ADD, "Five."]
    r = await client.post("/v1/responses", json=req(
        stream=True, tool_choice={"type": "mcp", "server_label": "tools", "name": "add"}))
    events = named_events(r.text)
    names = [n for n, _ in events]
    assert names[:2] == ["response.created", "response.in_progress"]
    assert names[2:6] == ["response.output_item.added", "response.mcp_list_tools.in_progress",
                          "response.mcp_list_tools.completed", "response.output_item.done"]
    assert names[6:12] == ["response.output_item.added", "response.mcp_call_arguments.delta",
                           "response.mcp_call_arguments.done", "response.mcp_call.in_progress",
                           "response.mcp_call.completed", "response.output_item.done"]
    assert names[-1] == "response.completed"
    assert "response.output_text.delta" in names[12:]
    assert [e["sequence_number"] for _, e in events] == list(range(len(events)))
    done = [e for n, e in events if n == "response.output_item.done"][1]["item"]
    assert done["output"] == "5" and done["status"] == "completed"
    final = events[-1][1]["response"]
    assert [i["type"] for i in final["output"]] == ["mcp_list_tools", "mcp_call", "message"]


@pytest.mark.parametrize(("reply", "timeout", "error"), [
    (call("boom"), 30.0, "Error executing tool boom"),
    (call("slow", '{"seconds": 60, "tag": "timeout"}'), 2.0, "did not answer within 2 s"),
])  # fmt: skip
async def test_a_failing_tool_is_folded_back_and_the_turn_goes_on(
    fake: FakeEngine, mcp_http: HttpMcp, tmp_path: Path, reply: str, timeout: float, error: str
) -> None:
    entries = servers(mcp_http.url, tmp_path / "s.log", tools={"timeout_s": timeout})
    async with mcp_client(fake, entries) as client:
        fake.replies = [reply, "Sorry, that failed."]
        r = await client.post("/v1/responses", json=req(tool_choice=force(reply)))
        assert r.status_code == 200, r.text
        _, called, message = r.json()["output"]
        assert called["status"] == "failed" and called["output"] is None
        assert error in called["error"]["content"][0]["text"]
        assert called["error"]["type"] == "mcp_tool_execution_error"
        assert message["content"][0]["text"] == "Sorry, that failed."
        assert "Error: " in prompt_text(fake, 1)
        # the server goes on serving
        fake.replies = [ADD, "5"]
        r = await client.post("/v1/responses", json=req(tool_choice=force(ADD)))
        assert r.json()["output"][1]["output"] == "5"


async def test_a_server_that_is_down_is_reported_and_the_turn_goes_on(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    fake.replies = ["No tools today."]
    tools = [{"type": "mcp", "server_label": "down", "require_approval": "never"}]
    r = await client.post("/v1/responses", json=req(tools=tools))
    assert r.status_code == 200, r.text
    listed, message = r.json()["output"]
    assert listed["type"] == "mcp_list_tools" and listed["tools"] == []
    assert "'down' is unavailable" in listed["error"]
    assert message["content"][0]["text"] == "No tools today."


async def test_a_huge_result_is_cut_with_a_note(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    fake.replies = [call("huge", '{"n": 50000}'), "Long."]
    r = await client.post("/v1/responses", json=req(tool_choice=force(fake.replies[0])))
    output = r.json()["output"][1]["output"]
    assert output.startswith("x" * 1000) and "cut from 50,000 to 1,000 characters" in output
    assert len(output) < 1100
    assert "cut from 50,000" in prompt_text(fake, 1)


async def test_stdio_server(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    fake.replies = [call("echo", '{"text": "over stdio"}'), "Done."]
    tools = [{"type": "mcp", "server_label": "local", "require_approval": "never"}]
    r = await client.post("/v1/responses", json=req(tools=tools, tool_choice=force(fake.replies[0], "local")))
    assert r.status_code == 200, r.text
    assert r.json()["output"][1]["output"] == "over stdio"


async def test_iterations_are_bounded(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    fake.reply = ADD.encode()  # the model would call forever
    r = await client.post("/v1/responses", json=req(tool_choice="required"))
    output = r.json()["output"]
    assert [i["type"] for i in output].count("mcp_call") == 3  # max_tool_iterations
    assert output[-1]["type"] == "message"
    assert len(fake.submitted) == 4
    assert fake.submitted[-1].sampling.grammar is None  # the last round may not call
    assert all(not r.sampling.grammar_lazy for r in fake.submitted[:-1])  # "required" holds


async def test_approval_round_trip(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    fake.replies = [ADD]
    tools = [{"type": "mcp", "server_label": "tools"}]  # require_approval: "always" by default
    r = await client.post("/v1/responses", json=req(tools=tools, tool_choice=force(ADD)))
    first = r.json()
    asked = first["output"][-1]
    assert asked["type"] == "mcp_approval_request" and asked["name"] == "add"
    assert json.loads(asked["arguments"]) == {"a": 2, "b": 3}
    assert "mcp_call" not in [i["type"] for i in first["output"]]
    fake.replies = ["It is 5."]
    r = await client.post("/v1/responses", json={
        "model": MODEL, "tools": tools, "previous_response_id": first["id"],
        "input": [{"type": "mcp_approval_response", "approval_request_id": asked["id"],
                   "approve": True}]})  # fmt: skip
    assert r.status_code == 200, r.text
    listed, called, message = r.json()["output"]
    assert called["approval_request_id"] == asked["id"] and called["output"] == "5"
    assert message["content"][0]["text"] == "It is 5."
    # the continuation ran on the first turn's session
    assert fake.submitted[0].session_id == fake.submitted[1].session_id
    # declined: no call, the model is told
    fake.replies = [ADD, "As you wish."]
    first = (await client.post("/v1/responses", json=req(tools=tools))).json()
    asked = first["output"][-1]
    r = await client.post("/v1/responses", json={
        "model": MODEL, "tools": tools, "previous_response_id": first["id"],
        "input": [{"type": "mcp_approval_response", "approval_request_id": asked["id"],
                   "approve": False}]})  # fmt: skip
    assert [i["type"] for i in r.json()["output"]] == ["mcp_list_tools", "message"]
    assert "declined" in prompt_text(fake, len(fake.submitted) - 1)


async def test_tool_list_changed_is_seen(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    fake.replies = [call("grow"), "Grown."]
    r = await client.post("/v1/responses", json=req(tool_choice=force(fake.replies[0])))
    assert r.json()["output"][1]["output"] == "grown"
    for _ in range(50):
        fake.replies = ["ok"]
        r = await client.post("/v1/responses", json=req())
        if "extra" in [t["name"] for t in r.json()["output"][0]["tools"]]:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the new tool was never listed")


async def test_cancelling_the_request_cancels_the_call(
    client: httpx.AsyncClient, fake: FakeEngine, mcp_http: HttpMcp
) -> None:
    fake.replies = [call("slow", '{"seconds": 30, "tag": "gone"}'), "never"]
    task = asyncio.ensure_future(client.post("/v1/responses", json=req(tool_choice=force(fake.replies[0]))))
    for _ in range(300):
        if "start gone" in mcp_http.lines():
            break
        await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(200):
        if "cancelled gone" in mcp_http.lines():
            break
        await asyncio.sleep(0.05)
    assert "cancelled gone" in mcp_http.lines() and "done gone" not in mcp_http.lines()


async def test_api_keys_limit_who_may_use_a_server(
    fake: FakeEngine, mcp_http: HttpMcp, tmp_path: Path
) -> None:
    entries = servers(mcp_http.url, tmp_path / "s.log")
    async with mcp_client(fake, entries, api_keys=("k1", "k2")) as client:
        locked = [{"type": "mcp", "server_label": "locked", "require_approval": "never"}]
        r = await client.post("/v1/responses", json=req(tools=locked),
                              headers={"Authorization": "Bearer k1"})  # fmt: skip
        assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0].server_label"
        fake.replies = ["fine"]
        r = await client.post("/v1/responses", json=req(tools=locked),
                              headers={"Authorization": "Bearer k2"})  # fmt: skip
        assert r.status_code == 200, r.text


BAD = [
    ({"tools": [{"type": "mcp"}]}, "tools[0].server_label"),
    ({"tools": [{"type": "mcp", "server_label": "nope"}]}, "tools[0].server_label"),
    ({"tools": [{"type": "mcp", "server_label": "tools", "server_url": "http://evil.example/mcp"}]},
     "tools[0].server_url"),
    ({"tools": [{"type": "mcp", "server_label": "x", "server_url": "http://169.254.169.254/"}]},
     "tools[0].server_url"),
    ({"tools": [{**NEVER, "allowed_tools": "add"}]}, "tools[0].allowed_tools"),
    ({"tools": [{**NEVER, "allowed_tools": {"read_only": True}}]},
     "tools[0].allowed_tools.read_only"),
    ({"tools": [{**NEVER, "require_approval": "sometimes"}]}, "tools[0].require_approval"),
    ({"tools": [{**NEVER, "require_approval": {"maybe": []}}]},
     "tools[0].require_approval.maybe"),
    ({"tools": [{**NEVER, "headers": {"X": 1}}]}, "tools[0].headers"),
    ({"tools": [{**NEVER, "connector_id": "connector_gmail"}]}, "tools[0].connector_id"),
    ({"tools": [{**NEVER, "bogus": 1}]}, "tools[0].bogus"),
    ({"tools": [NEVER, NEVER]}, "tools[1].server_label"),
    ({"tool_choice": {"type": "mcp", "server_label": "local"}}, "tool_choice.server_label"),
    ({"tool_choice": {"type": "mcp", "server_label": "tools", "name": "nope"}},
     "tool_choice.name"),
    ({"input": [{"type": "mcp_approval_response", "approval_request_id": "mcpr_x",
                 "approve": True}]}, "input[0].approval_request_id"),
    ({"tools": [{"type": "bogus_tool"}]}, "tools[0].type"),
]  # fmt: skip


@pytest.mark.parametrize(("extra", "param"), BAD)
async def test_bad_input_is_400_naming_the_field(
    client: httpx.AsyncClient, fake: FakeEngine, extra: dict[str, Any], param: str
) -> None:
    r = await client.post("/v1/responses", json=req(**extra))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
    assert fake.submitted == []
