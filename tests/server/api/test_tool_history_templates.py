"""A past tool call sent back renders with the templates that use an assistant turn's
content as a string (issue 17, item 20), on every route that takes one: chat
(`content: null` beside `tool_calls`, as the OpenAI SDK returns it), Messages and
count_tokens (an assistant turn that is only a `tool_use` block) and Responses (a
`function_call` item and its `function_call_output`)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from server.app import create_app
from server.config.tree import ModelSection, Settings
from tests.fakes import FakeEngine
from tests.server.api.test_openai_api import MODEL

TEMPLATES = Path(__file__).parents[2] / "chat" / "templates"
NAMES = [
    "Qwen-Qwen3-0.6B",
    "Qwen-QwQ-32B",
    "Bielik-11B-v3.0-Instruct",
    "mistralai-Ministral-3-14B-Reasoning-2512",
    "GLM-4.7-Flash",  # writes the null out: it must not become "None" in the prompt
]
CALL_ID = "abcDEF123"  # 9 alphanumerics: Mistral templates refuse other ids
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
ARGS = {"city": "Paris"}


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine(n_ctx=16384)


@pytest.fixture(params=NAMES)
async def client(request: pytest.FixtureRequest, fake: FakeEngine) -> AsyncIterator[Any]:
    path = TEMPLATES / f"{request.param}.jinja"
    settings = Settings(models=(ModelSection(id=MODEL, chat_template=str(path)),))
    transport = httpx.ASGITransport(app=create_app(settings, engine=fake))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client


def assert_rendered(r: httpx.Response, fake: FakeEngine) -> str:
    assert r.status_code == 200, r.text
    prompt = bytes(fake.submitted[-1].prompt_tokens).decode()
    for needle in ("Weather in Paris?", "get_weather", "Paris", "sunny, 21 C"):
        assert needle in prompt, needle
    assert "None" not in prompt
    return prompt


async def test_chat_completions(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    call = {"id": CALL_ID, "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps(ARGS)}}  # fmt: skip
    body = {"model": MODEL, "max_tokens": 4, "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": CALL_ID, "content": "sunny, 21 C"},
    ], "tools": [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather", "parameters": SCHEMA}}]}  # fmt: skip
    assert_rendered(await client.post("/v1/chat/completions", json=body), fake)


async def test_messages_and_count_tokens(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    body = {"model": MODEL, "max_tokens": 4, "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": CALL_ID, "name": "get_weather", "input": ARGS}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": CALL_ID, "content": "sunny, 21 C"}]},
    ], "tools": [{"name": "get_weather", "description": "Weather",
                  "input_schema": SCHEMA}]}  # fmt: skip
    headers = {"anthropic-version": "2023-06-01"}
    prompt = assert_rendered(await client.post("/v1/messages", json=body, headers=headers), fake)
    del body["max_tokens"]
    r = await client.post("/v1/messages/count_tokens", json=body, headers=headers)
    assert r.status_code == 200, r.text
    assert r.json() == {"input_tokens": len(prompt.encode())}


async def test_responses(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    body = {"model": MODEL, "max_output_tokens": 4, "store": False, "input": [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": CALL_ID, "name": "get_weather",
         "arguments": json.dumps(ARGS)},
        {"type": "function_call_output", "call_id": CALL_ID, "output": "sunny, 21 C"},
    ], "tools": [{"type": "function", "name": "get_weather", "description": "Weather",
                  "parameters": SCHEMA}]}  # fmt: skip
    assert_rendered(await client.post("/v1/responses", json=body), fake)
