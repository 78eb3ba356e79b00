"""Tools, response_format and reasoning over HTTP, against the fake engine."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.conftest import ClientFactory
from tests.fakes import FakeEngine
from tests.server.api.test_openai_api import MODEL, assert_error, chat, sse_events

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
ENVELOPE = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}]}'


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine(n_ctx=8192)  # tool descriptions make long prompts (1 byte = 1 token)


async def post(client: httpx.AsyncClient, body: dict[str, Any]) -> httpx.Response:
    return await client.post("/v1/chat/completions", json=body)


async def test_generic_required_call_shape_and_grammar(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    fake.reply = ENVELOPE.encode()
    r = await post(client, chat(tools=[WEATHER, TIME], tool_choice="required"))
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] is None
    (call,) = message["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "days": 2}
    sampling = fake.submitted[0].sampling
    assert sampling.grammar is not None and '"\\"tool_calls\\""' in sampling.grammar
    assert '"\\"get_time\\""' in sampling.grammar
    assert sampling.grammar_lazy is False
    prompt = bytes(fake.submitted[0].prompt_tokens).decode()
    assert "get_weather" in prompt and "You must call a tool." in prompt


async def test_auto_is_lazy_and_plain_text_stays_content(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    r = await post(client, chat(tools=[WEATHER]))
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] == "Hello from the fake engine."
    assert "tool_calls" not in choice["message"] and choice["finish_reason"] == "stop"
    sampling = fake.submitted[0].sampling
    assert sampling.grammar_lazy is True
    assert sampling.grammar_trigger_patterns == (r'\s*(\{\s*"tool_calls")[\s\S]*',)


async def test_named_choice_allows_only_that_tool(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    fake.reply = b'{"tool_calls": [{"name": "get_time", "arguments": {}}]}'
    body = chat(
        tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}}
    )
    r = await post(client, body)
    assert r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_time"
    grammar = fake.submitted[0].sampling.grammar
    assert grammar is not None and "get_weather" not in grammar


async def test_tool_choice_none_offers_no_tools(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    fake.reply = ENVELOPE.encode()
    r = await post(client, chat(tools=[WEATHER], tool_choice="none"))
    assert r.json()["choices"][0]["message"]["content"] == ENVELOPE
    assert fake.submitted[0].sampling.grammar is None
    assert "get_weather" not in bytes(fake.submitted[0].prompt_tokens).decode()


async def test_parallel_tool_calls_false_admits_one_call(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    await post(client, chat(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False))
    await post(client, chat(tools=[WEATHER], tool_choice="required"))
    one, many = (s.sampling.grammar or "" for s in fake.submitted)
    assert ")*" not in one.split("\n")[0] and ")*" in many.split("\n")[0]


async def test_streamed_calls_reassemble(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    fake.reply = (
        b'{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        b'{"name": "get_time", "arguments": {}}]}'
    )
    r = await post(client, chat(tools=[WEATHER, TIME], tool_choice="required", stream=True))
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    calls: dict[int, dict[str, Any]] = {}
    content = ""
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            for tc in delta.get("tool_calls", []):
                if "id" in tc:
                    assert tc["function"]["arguments"] == "" and tc["type"] == "function"
                    calls[tc["index"]] = {
                        "id": tc["id"],
                        "name": tc["function"]["name"],
                        "args": "",
                    }
                else:
                    calls[tc["index"]]["args"] += tc["function"]["arguments"]
    assert content == ""  # the envelope never leaks as content
    assert [c["name"] for c in calls.values()] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["args"]) == {"city": "Paris"} and json.loads(calls[1]["args"]) == {}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_history_renders_calls_and_results(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    r = await post(client, {"model": MODEL, "messages": messages, "tools": [WEATHER]})
    assert r.status_code == 200, r.text
    prompt = bytes(fake.submitted[0].prompt_tokens).decode()
    assert (
        '<|im_start|>assistant\n{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}<|im_end|>'
        in prompt
    )
    assert '"tool_response": {"name": "get_weather", "content": "sunny"}' in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


async def test_assistant_prefill_continues_the_message(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Well,"}]
    await post(client, {"model": MODEL, "messages": messages})
    prompt = bytes(fake.submitted[0].prompt_tokens).decode()
    assert prompt.endswith("<|im_start|>assistant\nWell,")


async def test_json_schema_response_format_sets_grammar(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    schema = {"type": "object", "properties": {"a": {"enum": ["x", "y"]}}, "required": ["a"]}
    rf = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
    await post(client, chat(response_format=rf))
    await post(client, chat(response_format={"type": "json_object"}))
    schema_grammar, object_grammar = (s.sampling.grammar or "" for s in fake.submitted)
    assert '"\\"x\\""' in schema_grammar and "root ::=" in schema_grammar
    assert object_grammar.startswith("root ::= object")


async def test_reasoning_split_with_a_thinking_template(
    make_client: ClientFactory, fake: FakeEngine
) -> None:
    template = (
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>"
        "{% if enable_thinking is defined and not enable_thinking %}<think></think>"
        "{% else %}<think>{% endif %}{% endif %}"
    )
    fake.reply = b"Let me think.</think>\n\nThe answer."
    client = make_client(fake)
    served = client._transport.app.state.models.default  # type: ignore[attr-defined]
    served.template_override, served._template = template, None
    r = await post(client, chat())
    msg = r.json()["choices"][0]["message"]
    assert (msg["reasoning_content"], msg["content"]) == ("Let me think.", "The answer.")
    r = await post(client, chat(reasoning_format="none"))
    assert r.json()["choices"][0]["message"]["content"] == "Let me think.</think>\n\nThe answer."
    r = await post(client, chat(stream=True))
    deltas = [
        json.loads(e)["choices"][0]["delta"]
        for e in sse_events(r.text)[:-1]
        if json.loads(e)["choices"]
    ]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Let me think."
    assert "".join(d.get("content", "") for d in deltas) == "The answer."
    await post(client, chat(chat_template_kwargs={"enable_thinking": False}))
    assert bytes(fake.submitted[-1].prompt_tokens).decode().endswith("<think></think>")


async def test_n_works_with_tools(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    fake.reply = ENVELOPE.encode()
    r = await post(client, chat(tools=[WEATHER], tool_choice="required", n=2))
    choices = r.json()["choices"]
    assert len(choices) == 2
    ids = {c["message"]["tool_calls"][0]["id"] for c in choices}
    assert len(ids) == 2 and all(c["finish_reason"] == "tool_calls" for c in choices)


BAD = [
    (chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]), "tools[0].function.parameters"),
    (chat(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
    (chat(tool_choice="required"), "tool_choice"),
    (chat(tools=[WEATHER], grammar='root ::= "a"'), "grammar"),
    (chat(response_format={"type": "json_object"}, grammar='root ::= "a"'), "grammar"),
    (chat(response_format={"type": "json_schema"}), "response_format.json_schema"),
    (chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "https://example.com/s"}}}), "response_format.json_schema.schema"),
    (chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 12}}}), "response_format.json_schema.schema"),
    (chat(tools=[{"type": "retrieval", "function": {"name": "f"}}]), "tools[0].type"),
    (chat(tools=[WEATHER, WEATHER]), "tools[1].function.name"),
    (chat(tools=[{"type": "function", "function": {"name": "bad name!"}}]), "tools[0].function.name"),
    (chat(reasoning_format="sideways"), "reasoning_format"),
    (
        {"model": MODEL, "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]},
        ]},
        "messages[1].tool_calls[0].function.arguments",
    ),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x", "tool_calls": []}, {"role": "user", "content": "x", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]}]}, "messages[1].tool_calls"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "param"), BAD)
async def test_bad_tool_requests_are_400(
    client: httpx.AsyncClient, fake: FakeEngine, body: dict[str, Any], param: str
) -> None:
    r = await post(client, body)
    assert_error(r, 400, param)
    assert fake.submitted == []


@pytest.mark.parametrize("as_file", [False, True])
async def test_configured_template_override_inline_and_file(
    tmp_path: Any, fake: FakeEngine, as_file: bool
) -> None:
    from server.app import create_app
    from server.config.tree import ModelSection, Settings

    source = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant] "
    value = source
    if as_file:
        path = tmp_path / "template.jinja"
        path.write_text(source)
        value = str(path)
    settings = Settings(models=(ModelSection(id="fake-model", chat_template=value),))
    app = create_app(settings, engine=fake)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        r = await post(client, chat())
    assert r.status_code == 200, r.text
    assert bytes(fake.submitted[0].prompt_tokens).decode() == "[user] Hi\n[assistant] "
