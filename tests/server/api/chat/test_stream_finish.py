"""A stream's finish_reason comes in a chunk of its own, after the last text or call
delta, with an empty delta (issue 10, item 3): a client that stops reading at the
finish_reason has everything by then."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.fakes import FakeEngine
from tests.server.api.chat.test_tools import TIME, WEATHER
from tests.server.api.test_openai_api import MODEL, REPLY, chat, sse_events


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine(n_ctx=8192)


def chunks_of(r: httpx.Response) -> list[dict[str, Any]]:
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def read_until_finish(chunks: list[dict[str, Any]], key: str) -> tuple[str, list[Any], Any]:
    """What a client gets that stops at the first finish_reason."""
    text, calls = "", []
    for chunk in chunks:
        for choice in chunk["choices"]:
            payload = choice[key] if key == "text" else choice["delta"]
            if key == "text":
                text += payload
            else:
                text += payload.get("content") or ""
                calls += payload.get("tool_calls", [])
            if choice["finish_reason"] is not None:
                assert (payload == "") if key == "text" else (payload == {}), choice
                return text, calls, choice["finish_reason"]
    raise AssertionError("no finish_reason")


@pytest.mark.parametrize("max_tokens", [None, 5])
async def test_chat_finish_has_its_own_chunk(client: httpx.AsyncClient, max_tokens: Any) -> None:
    r = await client.post("/v1/chat/completions", json=chat(stream=True, max_tokens=max_tokens))
    text, _, finish = read_until_finish(chunks_of(r), "delta")
    assert text == (REPLY if max_tokens is None else REPLY[:5])
    assert finish == ("stop" if max_tokens is None else "length")


async def test_chat_n2_each_finish_after_its_text(client: httpx.AsyncClient) -> None:
    chunks = chunks_of(await client.post("/v1/chat/completions", json=chat(stream=True, n=2)))
    seen: dict[int, str] = {0: "", 1: ""}
    for chunk in chunks:
        for choice in chunk["choices"]:
            if choice["finish_reason"] is not None:
                assert choice["delta"] == {} and seen[choice["index"]] == REPLY
            seen[choice["index"]] += choice["delta"].get("content", "")


async def test_tool_call_finish_has_its_own_chunk(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    fake.reply = b'{"tool_calls": [{"name": "get_time", "arguments": {}}]}'
    body = chat(tools=[WEATHER, TIME], tool_choice="required", stream=True)
    _, calls, finish = read_until_finish(
        chunks_of(await client.post("/v1/chat/completions", json=body)), "delta"
    )
    assert finish == "tool_calls"
    assert calls[0]["function"]["name"] == "get_time"
    assert "".join(c["function"]["arguments"] for c in calls) == "{}"


async def test_completion_finish_has_its_own_chunk(client: httpx.AsyncClient) -> None:
    body = {"model": MODEL, "prompt": "x", "max_tokens": 4, "stream": True}
    text, _, finish = read_until_finish(
        chunks_of(await client.post("/v1/completions", json=body)), "text"
    )
    assert (text, finish) == (REPLY[:4], "length")
