"""Tool turns that keep their KV (server/serving/replay.py, chat/replay.py): on every API,
turn 2's prompt starts with turn 1's prompt and exactly the text the model sampled for
its call, though the template writes that call differently; a call the client edited,
another tenant's call and a server with `[replay] max_bytes = 0` render from the template."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from server.app import create_app
from server.config.tree import AuthSection, ModelSection, ReplaySection, Settings
from tests.fakes import FakeEngine
from tests.server.api.test_openai_api import MODEL, sse_events

HERMES = Path(__file__).parents[2] / "chat" / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"
# What the model "samples": no spaces, keys out of order, where the template writes the
# call with spaces and its own order.
SAMPLED = '<tool_call>\n{"name":"get_weather","arguments":{"days":2,"city":"Paris"}}\n</tool_call>'
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}
USER = {"role": "user", "content": "Weather in Paris?"}
ANSWER = "Sunny."


def settings(**extra: Any) -> Settings:
    return Settings(models=(ModelSection(id=MODEL, chat_template=str(HERMES)),), **extra)


@pytest.fixture
def fake() -> FakeEngine:
    engine = FakeEngine(n_ctx=16384)
    engine.replies = [SAMPLED, ANSWER]
    return engine


async def make(fake: FakeEngine, config: Settings) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=create_app(config, engine=fake))
    return httpx.AsyncClient(transport=transport, base_url="http://test")


@pytest.fixture
async def client(fake: FakeEngine) -> AsyncIterator[httpx.AsyncClient]:
    async with await make(fake, settings()) as client:
        yield client


def prompts(fake: FakeEngine, first: int = -2) -> tuple[str, str]:
    """The prompt of the turn that sampled the call (`first`) and the last one's."""
    return tuple(bytes(fake.submitted[i].prompt_tokens).decode() for i in (first, -1))  # type: ignore[return-value]


def assert_replayed(fake: FakeEngine) -> None:
    first, second = prompts(fake)
    assert second.startswith(first + SAMPLED), (first, second)
    assert second[len(first) + len(SAMPLED) :].startswith("<|im_end|>\n<|im_start|>user\n")


def assert_template_rendered(fake: FakeEngine, first_turn: int = -2) -> None:
    first, second = prompts(fake, first_turn)
    assert second.startswith(first)  # the same head, then the template's own call
    assert SAMPLED not in second and '{"name": "get_weather", "arguments": {' in second


# -- Chat Completions ----------------------------------------------------------------

CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]


async def chat_turn(client: httpx.AsyncClient, stream: bool, **headers: str) -> dict[str, Any]:
    body = {"model": MODEL, "messages": [USER], "tools": CHAT_TOOLS, "tool_choice": "required",
            "stream": stream}  # fmt: skip
    r = await client.post("/v1/chat/completions", json=body, headers=headers)
    assert r.status_code == 200, r.text
    if not stream:
        message: dict[str, Any] = r.json()["choices"][0]["message"]
        return message
    calls: dict[int, dict[str, Any]] = {}
    for event in sse_events(r.text)[:-1]:
        for part in json.loads(event)["choices"][0]["delta"].get("tool_calls", []):
            call = calls.setdefault(part["index"], {"type": "function", "function": {
                "name": "", "arguments": ""}})  # fmt: skip
            call["id"] = part.get("id", call.get("id"))
            call["function"]["name"] += part["function"].get("name", "")
            call["function"]["arguments"] += part["function"].get("arguments", "")
    return {"role": "assistant", "content": None, "tool_calls": list(calls.values())}


async def chat_again(client: httpx.AsyncClient, turn: dict[str, Any], **headers: str) -> None:
    call_id = turn["tool_calls"][0]["id"]
    messages = [USER, turn, {"role": "tool", "tool_call_id": call_id, "content": "sunny"}]
    body = {"model": MODEL, "messages": messages, "tools": CHAT_TOOLS}
    r = await client.post("/v1/chat/completions", json=body, headers=headers)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_completions(client: httpx.AsyncClient, fake: FakeEngine, stream: bool) -> None:
    turn = await chat_turn(client, stream)
    assert json.loads(turn["tool_calls"][0]["function"]["arguments"]) == {
        "city": "Paris",
        "days": 2,
    }
    await chat_again(client, turn)
    assert_replayed(fake)


async def test_edited_arguments_render_from_the_template(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    turn = await chat_turn(client, False)
    turn["tool_calls"][0]["function"]["arguments"] = json.dumps({"city": "Lyon", "days": 2})
    await chat_again(client, turn)
    assert_template_rendered(fake)
    assert "Lyon" in prompts(fake)[1]


async def test_edited_content_and_unknown_ids_render_from_the_template(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    turn = await chat_turn(client, False)
    await chat_again(client, {**turn, "content": "Let me look."})
    assert_template_rendered(fake)
    fake.replies = [ANSWER]
    call = {**turn["tool_calls"][0], "id": "call_unknown"}
    await chat_again(client, {**turn, "tool_calls": [call]})
    assert_template_rendered(fake, first_turn=0)


async def test_same_arguments_written_otherwise_still_replay(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    """Arguments are compared as parsed JSON: the client's own spacing and key order."""
    turn = await chat_turn(client, False)
    turn["tool_calls"][0]["function"]["arguments"] = '{ "days" : 2 , "city" : "Paris" }'
    await chat_again(client, turn)
    assert_replayed(fake)


async def test_another_tenant_gets_the_template(fake: FakeEngine) -> None:
    async with await make(fake, settings(auth=AuthSection(api_keys=("key-a", "key-b")))) as c:
        turn = await chat_turn(c, False, authorization="Bearer key-a")
        await chat_again(c, turn, authorization="Bearer key-b")
        assert_template_rendered(fake)
        fake.replies = [SAMPLED, ANSWER]
        turn = await chat_turn(c, False, authorization="Bearer key-a")
        await chat_again(c, turn, authorization="Bearer key-a")
        assert_replayed(fake)


async def test_off_when_max_bytes_is_zero(fake: FakeEngine) -> None:
    async with await make(fake, settings(replay=ReplaySection(max_bytes=0))) as c:
        await chat_again(c, await chat_turn(c, False))
        assert_template_rendered(fake)


# -- Messages ------------------------------------------------------------------------

ANTHROPIC = {"anthropic-version": "2023-06-01"}
MESSAGES_TOOLS = [{"name": "get_weather", "input_schema": SCHEMA}]


@pytest.mark.parametrize("stream", [False, True])
async def test_messages(client: httpx.AsyncClient, fake: FakeEngine, stream: bool) -> None:
    body = {"model": MODEL, "max_tokens": 256, "messages": [USER], "tools": MESSAGES_TOOLS,
            "tool_choice": {"type": "any"}, "stream": stream}  # fmt: skip
    r = await client.post("/v1/messages", json=body, headers=ANTHROPIC)
    assert r.status_code == 200, r.text
    if stream:
        use: dict[str, Any] = {}
        partial = ""
        for block in r.text.strip().split("\n\n"):
            data = json.loads(block.split("data: ", 1)[1])
            if (
                data["type"] == "content_block_start"
                and data["content_block"]["type"] == "tool_use"
            ):
                use = data["content_block"]
            elif data["type"] == "content_block_delta" and "partial_json" in data["delta"]:
                partial += data["delta"]["partial_json"]
        use = {**use, "input": json.loads(partial)}
    else:
        (use,) = r.json()["content"]
    assert use["type"] == "tool_use" and use["id"].startswith("toolu_")
    body = {"model": MODEL, "max_tokens": 256, "tools": MESSAGES_TOOLS, "messages": [
        USER, {"role": "assistant", "content": [use]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                      "content": "sunny"}]}]}  # fmt: skip
    r = await client.post("/v1/messages", json=body, headers=ANTHROPIC)
    assert r.status_code == 200, r.text
    assert_replayed(fake)


# -- Responses -----------------------------------------------------------------------

RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "parameters": SCHEMA}]


@pytest.mark.parametrize("stream", [False, True])
async def test_responses_items_sent_back(
    client: httpx.AsyncClient, fake: FakeEngine, stream: bool
) -> None:
    body = {"model": MODEL, "input": [USER], "tools": RESPONSES_TOOLS, "tool_choice": "required",
            "store": False, "stream": stream}  # fmt: skip
    r = await client.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    if stream:
        done = [json.loads(b.split("data: ", 1)[1]) for b in r.text.strip().split("\n\n")]
        output = [d for d in done if d["type"] == "response.completed"][0]["response"]["output"]
    else:
        output = r.json()["output"]
    (call,) = [item for item in output if item["type"] == "function_call"]
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
    body = {"model": MODEL, "input": [USER, call, result], "tools": RESPONSES_TOOLS,
            "store": False}  # fmt: skip
    r = await client.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    assert_replayed(fake)


async def test_responses_previous_response_id(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    body = {"model": MODEL, "input": [USER], "tools": RESPONSES_TOOLS, "tool_choice": "required"}
    r = await client.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    (call,) = [item for item in r.json()["output"] if item["type"] == "function_call"]
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
    body = {"model": MODEL, "input": [result], "tools": RESPONSES_TOOLS,
            "previous_response_id": r.json()["id"]}  # fmt: skip
    r = await client.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    assert_replayed(fake)


# -- Ollama --------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_ollama_chat(client: httpx.AsyncClient, fake: FakeEngine, stream: bool) -> None:
    """Ollama's clients send a call back without an id: keyed by its name and arguments."""
    body = {"model": MODEL, "messages": [USER], "tools": CHAT_TOOLS, "stream": stream}
    r = await client.post("/api/chat", json=body)
    assert r.status_code == 200, r.text
    lines = [json.loads(line) for line in r.text.strip().split("\n")]
    (call,) = [c for line in lines for c in line["message"].get("tool_calls", [])]
    sent = {"function": {"name": call["function"]["name"],
                         "arguments": call["function"]["arguments"]}}  # fmt: skip
    body = {"model": MODEL, "stream": False, "tools": CHAT_TOOLS, "messages": [
        USER, {"role": "assistant", "content": "", "tool_calls": [sent]},
        {"role": "tool", "tool_name": "get_weather", "content": "sunny"}]}  # fmt: skip
    r = await client.post("/api/chat", json=body)
    assert r.status_code == 200, r.text
    assert_replayed(fake)
