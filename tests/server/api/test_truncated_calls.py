"""Tool calls cut off by max_tokens (issue 10, item 6): a call whose arguments did not
complete is not returned as a call, streamed or not; the calls before it are, with
finish_reason "length". History holding such a call does not break the next request."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.fakes import FakeEngine
from tests.server.api.chat.test_tools import TIME, WEATHER
from tests.server.api.test_openai_api import MODEL, assert_error, chat, sse_events

TWO_CALLS = (
    b'{"tool_calls": [{"name": "get_time", "arguments": {}}, '
    b'{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}]}'
)
CUT = TWO_CALLS.index(b"Paris") + 2  # inside the second call's arguments


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine(n_ctx=8192, reply=TWO_CALLS.decode())


async def test_cut_call_is_not_returned(client: httpx.AsyncClient) -> None:
    body = chat(tools=[WEATHER, TIME], tool_choice="required", max_tokens=CUT)
    choice = (await client.post("/v1/chat/completions", json=body)).json()["choices"][0]
    assert choice["finish_reason"] == "length"
    calls = choice["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_time"]
    assert choice["message"]["content"] is None


async def test_cut_only_call_leaves_an_empty_message(client: httpx.AsyncClient) -> None:
    body = chat(tools=[WEATHER, TIME], tool_choice="required", max_tokens=30)
    choice = (await client.post("/v1/chat/completions", json=body)).json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert "tool_calls" not in choice["message"] and choice["message"]["content"] == ""


async def test_cut_call_is_not_streamed(client: httpx.AsyncClient) -> None:
    body = chat(tools=[WEATHER, TIME], tool_choice="required", max_tokens=CUT, stream=True)
    events = sse_events((await client.post("/v1/chat/completions", json=body)).text)
    chunks = [json.loads(e) for e in events[:-1]]
    names = [
        tc["function"]["name"]
        for c in chunks
        for ch in c["choices"]
        for tc in ch["delta"].get("tool_calls", [])
        if "id" in tc
    ]
    assert names == ["get_time"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("arguments", ["", '{"ci', '{"city": "Par', '{"city":'])
async def test_history_with_a_cut_call_is_served(
    client: httpx.AsyncClient, fake: FakeEngine, arguments: str
) -> None:
    fake.reply = b"ok"
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]  # fmt: skip
    r = await client.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": messages, "tools": [WEATHER]}
    )
    assert r.status_code == 200, r.text


async def test_history_with_arguments_no_json_can_start_is_400(
    client: httpx.AsyncClient,
) -> None:
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": "city=Paris"}}]},
    ]  # fmt: skip
    r = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages})
    assert_error(r, 400, "messages[1].tool_calls[0].function.arguments")
