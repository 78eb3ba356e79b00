"""Tools together with a structured-output format (what agent frameworks send), and
tool schemas with the keywords Pydantic emits, on chat, responses and messages."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.chat.test_schema import PYDANTIC_SCHEMA
from tests.fakes import FakeEngine
from tests.server.api.chat.test_tools import WEATHER
from tests.server.api.test_openai_api import MODEL, chat

DOC = {"type": "object", "properties": {"capital": {"type": "string"}},
       "required": ["capital"], "additionalProperties": False}  # fmt: skip
FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": DOC}}
CALL = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'
PETS = {"type": "function", "function": {"name": "pets", "parameters": PYDANTIC_SCHEMA}}


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine(n_ctx=8192)


async def test_chat_tools_and_schema_make_one_grammar(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    fake.reply = b'{"capital": "Paris"}'
    r = await client.post("/v1/chat/completions",
                          json=chat(tools=[WEATHER], response_format=FORMAT))  # fmt: skip
    message = r.json()["choices"][0]["message"]
    assert json.loads(message["content"]) == {"capital": "Paris"} and "tool_calls" not in message
    sampling = fake.submitted[0].sampling
    assert sampling.grammar_lazy is False  # calls | document, from the first token
    assert sampling.grammar is not None
    root = sampling.grammar.splitlines()[0]
    assert '"\\"tool_calls\\""' in sampling.grammar and "doc-document" in root
    fake.reply = CALL.encode()
    r = await client.post("/v1/chat/completions",
                          json=chat(tools=[WEATHER], response_format=FORMAT))  # fmt: skip
    assert r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


async def test_required_tools_ignore_the_document(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    body = chat(tools=[WEATHER], tool_choice="required", response_format=FORMAT)
    assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    assert "doc-" not in (fake.submitted[0].sampling.grammar or "")


async def test_json_object_with_tools(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    body = chat(tools=[WEATHER], response_format={"type": "json_object"})
    assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    assert "doc-" in (fake.submitted[0].sampling.grammar or "")


async def test_responses_and_messages_take_tools_with_a_format(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"]}  # type: ignore[index]
    r = await client.post("/v1/responses", json={"model": MODEL, "input": "Hi", "tools": [tool],
        "text": {"format": {"type": "json_schema", "name": "a", "schema": DOC}}})  # fmt: skip
    assert r.status_code == 200, r.text
    r = await client.post("/v1/messages", json={"model": MODEL, "max_tokens": 50,
        "messages": [{"role": "user", "content": "Hi"}],
        "tools": [{"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}],  # type: ignore[index]
        "output_config": {"format": {"type": "json_schema", "schema": DOC}}})  # fmt: skip
    assert r.status_code == 200, r.text
    assert all("doc-" in (s.sampling.grammar or "") for s in fake.submitted)


@pytest.mark.parametrize(
    "choice", ["auto", "required", {"type": "function", "function": {"name": "pets"}}]
)
async def test_pydantic_tool_schema_is_accepted(
    client: httpx.AsyncClient, fake: FakeEngine, choice: Any
) -> None:
    r = await client.post("/v1/chat/completions",
                          json=chat(tools=[WEATHER, PETS], tool_choice=choice))  # fmt: skip
    assert r.status_code == 200, r.text
    assert fake.submitted[0].sampling.grammar is not None
