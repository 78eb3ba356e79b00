"""Issue 46's field decisions on the Messages API (and Chat's service_tier): server
tools left out (refused where tool_choice names one), `anthropic-beta` and
`service_tier` logged as hints, `thinking.display: "omitted"` honoured, a tool_result
with `is_error` shown to the model as an error."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest

from server.config.tree import ModelSection, Settings
from tests.conftest import ClientFactory
from tests.fakes import FakeEngine
from tests.server.api.messages.test_messages import WEATHER, assert_anthropic_error, post, req
from tests.server.api.responses.test_codex import THINKING
from tests.server.api.responses.test_responses import named_events
from tests.server.api.test_openai_api import MODEL

WEB_SEARCH = {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine(n_ctx=8192)


def prompt(fake: FakeEngine) -> str:
    return bytes(fake.submitted[-1].prompt_tokens).decode()


def messages_log(caplog: pytest.LogCaptureFixture, word: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if word in r.getMessage()]


async def test_server_tools_are_left_out_with_one_log_line(
    client: httpx.AsyncClient, fake: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    fetch = {"type": "web_fetch_20250910", "name": "web_fetch"}
    with caplog.at_level(logging.INFO, logger="kvserve.server"):
        r = await post(client, req(tools=[WEB_SEARCH, WEATHER, fetch]))
    assert r.status_code == 200, r.text
    assert '"get_weather"' in prompt(fake)  # the custom tool is shown
    assert "web_search" not in prompt(fake) and "web_fetch" not in prompt(fake)
    (line,) = messages_log(caplog, "server tools left out")
    assert "tools[0] (web_search_20250305)" in line and "tools[2] (web_fetch_20250910)" in line
    # Only server tools: the model sees none, and the answer is plain text.
    r = await post(client, req(tools=[WEB_SEARCH], stream=True))
    assert r.status_code == 200 and "tool_calls" not in prompt(fake)
    assert fake.submitted[-1].sampling.grammar is None


async def test_a_tool_choice_naming_a_server_tool_is_refused(client: httpx.AsyncClient) -> None:
    r = await post(client, req(tools=[WEB_SEARCH, WEATHER],
                               tool_choice={"type": "tool", "name": "web_search"}))  # fmt: skip
    assert_anthropic_error(r, 400, "invalid_request_error", "tool_choice.name")
    assert "server tool (web_search_20250305)" in r.json()["error"]["message"]
    ok = await post(client, req(tools=[WEB_SEARCH, WEATHER],
                                tool_choice={"type": "tool", "name": "get_weather"}))  # fmt: skip
    assert ok.status_code == 200, ok.text


async def test_errors_name_a_tool_where_the_request_has_it(client: httpx.AsyncClient) -> None:
    """A tool's index in the request, not among the tools the model sees."""
    bad = {"name": "f", "input_schema": {"type": 5}}
    r = await post(client, req(tools=[WEB_SEARCH, bad]))
    assert_anthropic_error(r, 400, "invalid_request_error", "tools[1].input_schema")
    r = await post(client, req(tools=[WEB_SEARCH, {"type": "computer_20250124", "name": "c"}]))
    assert_anthropic_error(r, 400, "invalid_request_error", "tools[1].type")  # a client tool


async def test_anthropic_beta_values_are_logged_once_as_hints(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    beta = "claude-code-20250219, interleaved-thinking-2025-05-14,effort-2025-11-24"
    with caplog.at_level(logging.INFO, logger="kvserve.server"):
        r = await post(client, req(), **{"anthropic-beta": beta})
        assert r.status_code == 200, r.text
        (line,) = messages_log(caplog, "anthropic-beta")
        assert "hints" in line
        assert "claude-code-20250219, interleaved-thinking-2025-05-14, effort-2025-11-24" in line
        caplog.clear()
        r = await client.post("/v1/messages/count_tokens", headers={
            "anthropic-version": "2023-06-01", "anthropic-beta": "token-counting-2024-11-01"},
            json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]})  # fmt: skip
        assert r.status_code == 200, r.text
        assert len(messages_log(caplog, "token-counting-2024-11-01")) == 1
        caplog.clear()
        await post(client, req())  # no header: no line
        assert not messages_log(caplog, "anthropic-beta")


async def test_chat_service_tier_is_logged_as_a_hint(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
            "service_tier": "flex", "surprise": 1}  # fmt: skip
    with caplog.at_level(logging.INFO, logger="kvserve.server"):
        r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    (hint,) = messages_log(caplog, "hints")
    assert "service_tier" in hint
    (unknown,) = messages_log(caplog, "unknown fields")
    assert "surprise" in unknown and "service_tier" not in unknown


@pytest.fixture
def thinking(make_client: ClientFactory, fake: FakeEngine) -> httpx.AsyncClient:
    fake.reply = b"<think>The user greets me.</think>Hello!"
    settings = Settings(models=(ModelSection(id=MODEL, chat_template=THINKING),))
    return make_client(fake, settings=settings)


@pytest.mark.parametrize("kind", ["enabled", "adaptive"])
async def test_omitted_thinking_comes_back_empty(thinking: httpx.AsyncClient, kind: str) -> None:
    mode: dict[str, Any] = {"type": kind, "display": "omitted"}
    if kind == "enabled":
        mode["budget_tokens"] = 1024
    body = req(max_tokens=2048, thinking=mode)
    r = await post(thinking, body)
    assert r.status_code == 200, r.text
    assert r.json()["content"] == [{"type": "thinking", "thinking": "", "signature": ""},
                                   {"type": "text", "text": "Hello!"}]  # fmt: skip
    events = named_events((await post(thinking, {**body, "stream": True})).text)
    starts = [d["content_block"] for n, d in events if n == "content_block_start"]
    assert starts[0] == {"type": "thinking", "thinking": "", "signature": ""}
    deltas = [d["delta"]["type"] for n, d in events if n == "content_block_delta"]
    assert "thinking_delta" not in deltas and "text_delta" in deltas


async def test_thinking_is_shown_unless_omitted(thinking: httpx.AsyncClient) -> None:
    for display in ({}, {"display": "summarized"}):
        body = req(max_tokens=2048, thinking={"type": "adaptive", **display})
        content = (await post(thinking, body)).json()["content"]
        assert content[0]["thinking"] == "The user greets me."
        events = named_events((await post(thinking, {**body, "stream": True})).text)
        deltas = [d["delta"] for n, d in events if n == "content_block_delta"]
        thought = "".join(d["thinking"] for d in deltas if d["type"] == "thinking_delta")
        assert thought == "The user greets me."
    r = await post(thinking, req(thinking={"type": "adaptive", "display": "hidden"}))
    assert_anthropic_error(r, 400, "invalid_request_error", "thinking.display")


def tool_turn(result: dict[str, Any]) -> list[dict[str, Any]]:
    call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}
    return [{"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                          **result}]}]  # fmt: skip


async def test_a_tool_result_with_is_error_reads_as_an_error(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    failed = tool_turn({"content": "city not found", "is_error": True})
    r = await post(client, req(tools=[WEATHER], messages=failed))
    assert r.status_code == 200, r.text
    assert "Error: city not found" in prompt(fake)
    blocks = tool_turn({"content": [{"type": "text", "text": "city not found"}], "is_error": True})
    await post(client, req(tools=[WEATHER], messages=blocks))
    assert "Error: city not found" in prompt(fake)
    fine = tool_turn({"content": "12 C", "is_error": False})
    await post(client, req(tools=[WEATHER], messages=fine))
    assert "12 C" in prompt(fake) and "Error:" not in prompt(fake)
