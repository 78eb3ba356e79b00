"""POST /v1/messages and /v1/messages/count_tokens against the fake engine: Anthropic's
shapes and event sequence, x-api-key, its error envelope, bad input naming the field."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from server.api.messages.input import message_options
from server.api.messages.protocol import CountTokensRequest, MessagesRequest
from server.config.tree import AuthSection, ModelNamesSection, Settings
from tests.conftest import ClientFactory
from tests.fakes import FakeEngine
from tests.server.api.responses.test_responses import named_events
from tests.server.api.test_openai_api import MODEL, REPLY

WEATHER = {"name": "get_weather", "description": "Weather in a city", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CALL = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'
HEADERS = {"anthropic-version": "2023-06-01"}


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine(n_ctx=8192)


def req(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}],
            **extra}  # fmt: skip


def assert_anthropic_error(r: httpx.Response, status: int, kind: str, field: str = "") -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == kind
    assert body["error"]["message"].startswith(f"{field}:" if field else "")


async def post(client: httpx.AsyncClient, body: dict[str, Any], **kw: Any) -> httpx.Response:
    return await client.post("/v1/messages", json=body, headers={**HEADERS, **kw})


async def test_message_shape(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    r = await post(client, req(system=[{"type": "text", "text": "Be brief.",
                                        "cache_control": {"type": "ephemeral"}}]))  # fmt: skip
    body = r.json()
    assert body["type"] == "message" and body["role"] == "assistant"
    assert body["id"].startswith("msg_") and body["model"] == MODEL
    assert body["content"] == [{"type": "text", "text": REPLY}]
    assert body["stop_reason"] == "end_turn" and body["stop_sequence"] is None
    prompt = len(fake.submitted[0].prompt_tokens)
    assert body["usage"] == {"input_tokens": prompt, "output_tokens": len(REPLY) + 1,
                             "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    assert bytes(fake.submitted[0].prompt_tokens).decode().startswith("<|im_start|>system\nBe brief.")


async def test_cached_prefix_is_cache_read(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    fake.cached = 20
    usage = (await post(client, req())).json()["usage"]
    assert usage["cache_read_input_tokens"] == 20
    assert usage["input_tokens"] + 20 == len(fake.submitted[0].prompt_tokens)


async def test_message_start_carries_the_cache_split(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    """The engine tells how much of the prompt it found before the prefill: the stream's
    first event reports it (it used to say 0 cached until message_delta)."""
    fake.cached = 20
    events = named_events((await post(client, req(stream=True))).text)
    name, start = events[0]
    prompt = len(fake.submitted[0].prompt_tokens)
    assert name == "message_start"
    assert start["message"]["usage"]["cache_read_input_tokens"] == 20
    assert start["message"]["usage"]["input_tokens"] == prompt - 20
    assert events[-2][1]["usage"]["cache_read_input_tokens"] == 20


async def test_stream_event_sequence(client: httpx.AsyncClient) -> None:
    events = named_events((await post(client, req(stream=True))).text)
    names = [n for n, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert text == REPLY
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == len(REPLY) + 1
    assert "[DONE]" not in (await post(client, req(stream=True))).text


async def test_tool_any_gives_tool_use(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    fake.reply = CALL.encode()
    body = (await post(client, req(tools=[WEATHER], tool_choice={"type": "any"},
                                   max_tokens=200))).json()  # fmt: skip
    (block,) = body["content"]
    assert block["type"] == "tool_use" and block["id"].startswith("toolu_")
    assert block["name"] == "get_weather" and block["input"] == {"city": "Paris"}
    assert body["stop_reason"] == "tool_use"
    assert fake.submitted[0].sampling.grammar_lazy is False
    events = named_events((await post(client, req(tools=[WEATHER], tool_choice={"type": "any"},
                                                   stream=True, max_tokens=200))).text)  # fmt: skip
    starts = [d for n, d in events if n == "content_block_start"]
    assert starts[0]["content_block"]["type"] == "tool_use" and starts[0]["index"] == 0
    partial = "".join(d["delta"]["partial_json"] for n, d in events if n == "content_block_delta")
    assert json.loads(partial) == {"city": "Paris"}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


async def test_tool_result_round_trip(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "text", "text": "sunny"}]},
                                     {"type": "text", "text": "And?"}]},
    ]  # fmt: skip
    r = await post(client, req(messages=messages, tools=[WEATHER]))
    assert r.status_code == 200, r.text
    prompt = bytes(fake.submitted[0].prompt_tokens).decode()
    assert prompt.index("Let me look.") < prompt.index("sunny") < prompt.index("And?")
    assert '"city": "Paris"' in prompt


async def test_output_config_format_is_a_grammar(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    fmt = {"type": "json_schema", "schema": {"type": "object", "properties": {
        "city": {"type": "string"}}, "required": ["city"]}}
    r = await post(client, req(output_config={"format": fmt}, cache_control={"type": "ephemeral"}))
    assert r.status_code == 200, r.text
    assert fake.submitted[0].sampling.grammar is not None


async def test_stop_reasons(client: httpx.AsyncClient) -> None:
    cut = (await post(client, req(max_tokens=3))).json()
    assert cut["stop_reason"] == "max_tokens" and cut["content"][0]["text"] == REPLY[:3]
    stopped = (await post(client, req(stop_sequences=["fake"]))).json()
    assert stopped["stop_reason"] == "stop_sequence" and stopped["stop_sequence"] == "fake"


async def test_count_tokens_matches_usage(client: httpx.AsyncClient) -> None:
    body = req(system="Be brief.", tools=[WEATHER])
    count = await client.post("/v1/messages/count_tokens",
                              json={k: v for k, v in body.items() if k != "max_tokens"})  # fmt: skip
    usage = (await post(client, body)).json()["usage"]
    assert count.json() == {"input_tokens": usage["input_tokens"]}


async def test_x_api_key_and_error_envelope(make_client: ClientFactory, fake: FakeEngine) -> None:
    names = ModelNamesSection(any_with_one_model=False)  # else one model answers any name
    client = make_client(fake, settings=Settings(auth=AuthSection(api_keys=("k1",)),
                                                 model_names=names))  # fmt: skip
    assert (await post(client, req(), **{"x-api-key": "k1"})).status_code == 200
    assert_anthropic_error(await post(client, req()), 401, "authentication_error")
    assert_anthropic_error(await post(client, req(), **{"x-api-key": "nope"}), 401,
                           "authentication_error")  # fmt: skip
    r = await post(client, req(model="claude-opus"), **{"x-api-key": "k1"})
    assert_anthropic_error(r, 404, "not_found_error", "model")


async def test_queue_full_is_rate_limit_error(make_client: ClientFactory) -> None:
    fake = FakeEngine()
    fake.outstanding = fake.capacity  # every slot and queue place taken
    client = make_client(fake)
    assert_anthropic_error(await post(client, req()), 429, "rate_limit_error")


async def test_engine_failure_midstream_is_an_error_event(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    fake.fail_next = True
    name, data = named_events((await post(client, req(stream=True))).text)[-1]
    assert name == "error" and data["error"]["type"] == "api_error"
    fake.fail_next = True
    assert_anthropic_error(await post(client, req()), 500, "api_error")


BAD: list[tuple[dict[str, Any], str]] = [
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}, "model"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    (req(max_tokens=0), "max_tokens"),
    (req(max_tokens="many"), "max_tokens"),
    (req(messages=[]), "messages"),
    (req(messages="Hi"), "messages"),
    (req(messages=[{"role": "tool", "content": "x"}]), "messages[0].role"),
    (req(messages=[{"role": "system", "content": [{"type": "image"}]}]),
     "messages[0].content[0].type"),
    (req(messages=[{"role": "user"}]), "messages[0].content"),
    (req(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
    (req(messages=[{"role": "user", "content": [{"text": "x"}]}]), "messages[0].content[0].type"),
    (req(messages=[{"role": "user", "content": [{"type": "text"}]}]),
     "messages[0].content[0].text"),
    (req(messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}]),
     "messages[0].content[0].source"),
    (req(messages=[{"role": "user", "content": [{"type": "document", "source": {}}]}]),
     "messages[0].content[0].type"),
    (req(messages=[{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                 "input": {}}]}]), "messages[0].content[0].type"),
    (req(messages=[{"role": "assistant", "content": [{"type": "tool_use", "name": "f",
                                                      "input": {}}]}]), "messages[0].content[0].id"),
    (req(messages=[{"role": "assistant", "content": [{"type": "tool_use", "id": "t",
                                                      "input": {}}]}]), "messages[0].content[0].name"),
    (req(messages=[{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                      "input": "{}"}]}]), "messages[0].content[0].input"),
    (req(messages=[{"role": "user", "content": [{"type": "tool_result"}]}]),
     "messages[0].content[0].tool_use_id"),
    (req(messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                 "is_error": "yes"}]}]),
     "messages[0].content[0].is_error"),
    (req(messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                 "content": [{"type": "image"}]}]}]),
     "messages[0].content[0].content[0].source"),
    (req(system=5), "system"),
    (req(system=[{"type": "image"}]), "system[0].type"),
    (req(tools=[{"name": "f"}]), "tools[0].input_schema"),
    (req(tools=[{"input_schema": {}}]), "tools[0].name"),
    (req(tools=[{"name": "bad name!", "input_schema": {}}]), "tools[0].name"),
    (req(tools=[{"name": "f", "input_schema": {"type": 5}}]), "tools[0].input_schema"),
    (req(tools=[{"name": "f", "description": 5, "input_schema": {}}]), "tools[0].description"),
    (req(tools=[{"type": "bash_20250124", "name": "bash"}]), "tools[0].type"),  # a client tool
    (req(tools=[{"type": "web_search_20250305", "name": "web_search"}],
         tool_choice={"type": "tool", "name": "web_search"}), "tool_choice.name"),
    (req(tools=[WEATHER, WEATHER]), "tools[1].name"),
    (req(tool_choice={"type": "sometimes"}), "tool_choice.type"),
    (req(tool_choice="auto"), "tool_choice"),
    (req(tool_choice={"type": "any"}), "tool_choice"),
    (req(tool_choice={"type": "tool"}), "tool_choice.name"),
    (req(tools=[WEATHER], tool_choice={"type": "tool", "name": "other"}), "tool_choice"),
    (req(tool_choice={"type": "auto", "disable_parallel_tool_use": "x"}),
     "tool_choice.disable_parallel_tool_use"),
    (req(stop_sequences="x"), "stop_sequences"),
    (req(stop_sequences=[""]), "stop_sequences[0]"),
    (req(temperature=1.5), "temperature"),
    (req(top_p=-1), "top_p"),
    (req(top_k=-1), "top_k"),
    (req(thinking={"type": "enabled"}), "thinking.budget_tokens"),
    (req(thinking={"type": "enabled", "budget_tokens": 64}), "thinking.budget_tokens"),
    (req(thinking={"type": "maybe"}), "thinking.type"),
    (req(metadata={"user_id": 5}), "metadata.user_id"),
    (req(stream="maybe"), "stream"),
    (req(mcp_servers=[{"url": "x"}]), "mcp_servers"),
    (req(container="c"), "container"),
    (req(service_tier="priority"), "service_tier"),
    (req(output_config={"effort": "extreme"}), "output_config.effort"),
    (req(output_config={"format": {"type": "xml", "schema": {}}}), "output_config.format.type"),
    (req(output_config={"format": {"type": "json_schema"}}), "output_config.format.schema"),
    (req(output_config={"format": {"type": "json_schema", "schema": {"type": 5}}}),
     "output_config.format.schema"),
    (req(speed="fast"), "speed"),
    (req(cache_control="yes"), "cache_control"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "field"), BAD, ids=[f for _, f in BAD])
async def test_bad_input_is_400_naming_the_field(
    client: httpx.AsyncClient, fake: FakeEngine, body: dict[str, Any], field: str
) -> None:
    assert_anthropic_error(await post(client, body), 400, "invalid_request_error", field)
    assert fake.submitted == []


async def test_bad_count_tokens(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": []})
    assert_anthropic_error(r, 400, "invalid_request_error", "messages")


OPTIONAL = [f.alias or n for n, f in MessagesRequest.model_fields.items() if not f.is_required()]


@pytest.mark.parametrize("name", OPTIONAL)
async def test_null_optional_field_is_absent(client: httpx.AsyncClient, name: str) -> None:
    r = await post(client, req(**{name: None}))
    assert r.status_code == 200, r.text


# What Claude Code 2.1 sends on every request (captured): the hints and limits that were
# each a 400 on round 4's kvserve.
CLAUDE_CODE = req(
    max_tokens=32000,
    thinking={"type": "adaptive"},
    output_config={"effort": "high"},
    context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    metadata={"user_id": "user_abc_account__session_0f3c"},
    messages=[
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        {"role": "system", "content": "Reminder: be brief."},
        {"role": "user", "content": "What now?"},
    ],
)


async def test_what_claude_code_sends_is_answered(client: httpx.AsyncClient,
                                                  fake: FakeEngine) -> None:
    r = await post(client, CLAUDE_CODE, **{"anthropic-beta": "context-management-2025-06-27"})
    assert r.status_code == 200, r.text
    assert r.json()["stop_reason"] == "end_turn"
    (request,) = fake.submitted
    prompt = bytes(request.prompt_tokens).decode()
    # the system message is a system turn in its place, between the two user turns
    assert prompt.index("<|im_start|>user\nHi") < prompt.index(
        "<|im_start|>system\nReminder: be brief.") < prompt.index("<|im_start|>user\nWhat now?")
    # max_tokens past the context is not refused; the engine ends the answer where the
    # context does (engine/loop/validation.py check_context)
    assert request.max_tokens == 32000 and len(request.prompt_tokens) + 32000 > 8192


def test_effort_and_thinking_set_the_templates_switches() -> None:
    def kwargs(**extra: Any) -> dict[str, Any]:
        return message_options(CountTokensRequest.model_validate(req(**extra))).template_kwargs

    assert kwargs() == {}
    assert kwargs(output_config={"effort": "low"}) == {"enable_thinking": True,
                                                       "reasoning_effort": "low"}
    assert kwargs(thinking={"type": "adaptive"}) == {"enable_thinking": True}
    assert kwargs(thinking={"type": "disabled"}, output_config={"effort": "high"}) == {
        "enable_thinking": False, "reasoning_effort": "high"}


async def test_a_prompt_that_leaves_no_room_is_worded_as_anthropic_words_it(
    make_client: ClientFactory,
) -> None:
    client = make_client(FakeEngine(n_ctx=64))
    r = await post(client, req(messages=[{"role": "user", "content": "x" * 200}]))
    assert_anthropic_error(r, 400, "invalid_request_error")
    message = r.json()["error"]["message"]
    assert message.startswith("prompt is too long: ") and message.endswith(" > 64 maximum")
    openai = await client.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "x" * 200}]})
    assert openai.json()["error"]["code"] == "context_length_exceeded"


async def test_a_hint_is_logged_once_as_a_hint(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="kvserve.server")
    r = await post(client, req(context_management={"edits": []}, surprise=1))
    assert r.status_code == 200, r.text
    lines = [record.getMessage() for record in caplog.records]
    assert any("hints" in line and "context_management" in line for line in lines)
    unknown = [line for line in lines if "ignoring unknown fields" in line]
    assert unknown == ["messages: ignoring unknown fields ['surprise']"]
