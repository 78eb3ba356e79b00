"""POST/GET/DELETE /v1/responses against the fake engine: shapes, the event sequence,
stored conversations on sessions, ownership, and bad input (400 naming the field)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from server.api.responses.protocol import ResponsesRequest
from tests.conftest import ClientFactory
from tests.fakes import FakeEngine
from tests.server.api.test_openai_api import MODEL, REPLY, assert_error

WEATHER = {
    "type": "function", "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]},
}  # fmt: skip
CALL = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine(n_ctx=8192)


def req(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": "Hi", **extra}


def named_events(body: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in body.strip("\n").split("\n\n"):
        lines = [line for line in block.split("\n") if not line.startswith(":")]
        assert len(lines) == 2 and lines[0].startswith("event: "), block
        name, data = lines[0][7:], json.loads(lines[1][6:])
        assert data["type"] == name
        out.append((name, data))
    return out


async def test_plain_response_shape(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    r = await client.post("/v1/responses", json=req(instructions="Be brief.", metadata={"a": "b"}))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "response" and body["id"].startswith("resp_")
    assert body["status"] == "completed" and body["incomplete_details"] is None
    (item,) = body["output"]
    assert item["type"] == "message" and item["role"] == "assistant" and item["status"] == "completed"
    assert item["content"] == [{"type": "output_text", "text": REPLY, "annotations": [], "logprobs": []}]
    usage = body["usage"]
    assert usage["input_tokens"] == len(fake.submitted[0].prompt_tokens)
    assert usage["output_tokens"] == len(REPLY) + 1
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert usage["input_tokens_details"] == {"cached_tokens": 0}
    assert body["metadata"] == {"a": "b"} and body["instructions"] == "Be brief."
    prompt = bytes(fake.submitted[0].prompt_tokens).decode()
    assert prompt.startswith("<|im_start|>system\nBe brief.")  # instructions: the system turn


async def test_stream_event_sequence(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/responses", json=req(stream=True))
    events = named_events(r.text)
    names = [n for n, _ in events]
    assert names[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]  # fmt: skip
    assert names[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]  # fmt: skip
    assert set(names[4:-4]) == {"response.output_text.delta"}
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    text = "".join(d["delta"] for n, d in events if n == "response.output_text.delta")
    final = events[-1][1]["response"]
    assert text == REPLY == final["output"][0]["content"][0]["text"]
    assert events[-4][1]["text"] == REPLY
    assert final["status"] == "completed" and final["usage"]["output_tokens"] == len(REPLY) + 1


async def test_required_tool_gives_a_function_call(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    fake.reply = CALL.encode()
    r = await client.post("/v1/responses", json=req(tools=[WEATHER], tool_choice="required"))
    (item,) = r.json()["output"]
    assert item["type"] == "function_call" and item["name"] == "get_weather"
    assert item["call_id"].startswith("call_") and item["id"].startswith("fc_")
    assert json.loads(item["arguments"]) == {"city": "Paris"}
    assert fake.submitted[0].sampling.grammar_lazy is False
    r = await client.post("/v1/responses", json=req(tools=[WEATHER], tool_choice="required",
                                                     stream=True))  # fmt: skip
    events = named_events(r.text)
    names = [n for n, _ in events]
    assert names[2:] == ["response.output_item.added", "response.function_call_arguments.delta",
                         "response.function_call_arguments.done", "response.output_item.done",
                         "response.completed"]  # fmt: skip
    assert json.loads(events[4][1]["arguments"]) == {"city": "Paris"}


async def test_function_call_output_round_trip(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    fake.reply = CALL.encode()
    first = (await client.post("/v1/responses", json=req(tools=[WEATHER]))).json()
    call = first["output"][0]
    fake.reply = b"It is sunny."
    body = req(previous_response_id=first["id"], tools=[WEATHER], input=[
        {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny, 21 C"}])
    r = await client.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    prompt = bytes(fake.submitted[-1].prompt_tokens).decode()
    assert "sunny, 21 C" in prompt and "get_weather" in prompt and "Hi" in prompt


async def test_previous_response_continues_on_one_session(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    first = (await client.post("/v1/responses", json=req(input="one"))).json()
    second = (await client.post("/v1/responses",
                                json=req(input="two", previous_response_id=first["id"]))).json()
    third = (await client.post("/v1/responses",
                               json=req(input="three", previous_response_id=second["id"]))).json()
    assert third["previous_response_id"] == second["id"]
    sessions = {r.session_id for r in fake.submitted}
    assert len(sessions) == 1 and None not in sessions
    prompt = bytes(fake.submitted[-1].prompt_tokens).decode()
    assert prompt.index("one") < prompt.index(REPLY) < prompt.index("two") < prompt.index("three")
    previous = bytes(fake.submitted[-2].prompt_tokens).decode()
    assert prompt.startswith(previous)  # the next turn extends the last: only the new part is new


async def test_store_false_keeps_nothing(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    body = (await client.post("/v1/responses", json=req(store=False))).json()
    assert fake.submitted[0].session_id is None
    assert_error(await client.get(f"/v1/responses/{body['id']}"), 404)


async def test_get_delete_and_unknown(client: httpx.AsyncClient) -> None:
    body = (await client.post("/v1/responses", json=req())).json()
    got = await client.get(f"/v1/responses/{body['id']}")
    assert got.status_code == 200 and got.json() == body
    deleted = await client.delete(f"/v1/responses/{body['id']}")
    assert deleted.json() == {"id": body["id"], "object": "response.deleted", "deleted": True}
    assert_error(await client.get(f"/v1/responses/{body['id']}"), 404)
    assert_error(await client.delete(f"/v1/responses/{body['id']}"), 404)
    r = await client.post("/v1/responses", json=req(previous_response_id="resp_nope"))
    assert assert_error(r, 404, "previous_response_id")["code"] == "response_not_found"


async def test_another_keys_response_is_404(make_client: ClientFactory, fake: FakeEngine) -> None:
    client = make_client(fake, api_keys=("k1", "k2"))
    body = (await client.post("/v1/responses", json=req(),
                              headers={"Authorization": "Bearer k1"})).json()  # fmt: skip
    other = {"Authorization": "Bearer k2"}
    assert_error(await client.get(f"/v1/responses/{body['id']}", headers=other), 404)
    r = await client.post("/v1/responses", json=req(previous_response_id=body["id"]), headers=other)
    assert_error(r, 404, "previous_response_id")
    assert_error(await client.delete(f"/v1/responses/{body['id']}", headers=other), 404)
    mine = await client.get(f"/v1/responses/{body['id']}", headers={"Authorization": "Bearer k1"})
    assert mine.status_code == 200


async def test_max_output_tokens_is_incomplete(client: httpx.AsyncClient) -> None:
    body = (await client.post("/v1/responses", json=req(max_output_tokens=5))).json()
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete"
    r = await client.post("/v1/responses", json=req(max_output_tokens=5, stream=True))
    assert named_events(r.text)[-1][0] == "response.incomplete"


async def test_engine_failure_midstream_is_response_failed(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    fake.fail_next = True
    events = named_events((await client.post("/v1/responses", json=req(stream=True))).text)
    name, data = events[-1]
    assert name == "response.failed" and data["response"]["status"] == "failed"
    assert "llama_decode failed" in data["response"]["error"]["message"]


async def test_json_schema_format_becomes_a_grammar(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    fmt = {"type": "json_schema", "name": "city", "strict": True, "schema": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    r = await client.post("/v1/responses", json=req(text={"format": fmt}))
    assert r.status_code == 200, r.text
    assert r.json()["text"]["format"]["name"] == "city"
    assert fake.submitted[0].sampling.grammar is not None


BAD: list[tuple[dict[str, Any], str]] = [
    ({"input": "Hi"}, "model"),
    ({"model": MODEL}, "input"),
    (req(input=""), "input"),
    (req(input=[]), "input"),
    (req(input=5), "input"),
    (req(input=[{"role": "robot", "content": "x"}]), "input[0].role"),
    (req(input=[{"role": "user"}]), "input[0].content"),
    (req(input=[{"role": "user", "content": 5}]), "input[0].content"),
    (req(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
     "input[0].content[0].image_url"),
    (req(input=[{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]),
     "input[0].content[0].type"),
    (req(input=[{"role": "user", "content": [{"type": "input_text"}]}]),
     "input[0].content[0].text"),
    (req(input=[{"type": "function_call", "name": "f", "arguments": "{}"}]), "input[0].call_id"),
    (req(input=[{"type": "function_call", "call_id": "c", "arguments": "{}"}]), "input[0].name"),
    (req(input=[{"type": "function_call", "call_id": "c", "name": "f", "arguments": 3}]),
     "input[0].arguments"),
    (req(input=[{"type": "function_call_output", "output": "x"}]), "input[0].call_id"),
    (req(input=[{"type": "function_call_output", "call_id": "c"}]), "input[0].output"),
    (req(input=[{"type": "web_search_call", "id": "w"}]), "input[0].type"),
    (req(input=[{"content": "x"}]), "input[0].type"),
    (req(instructions=5), "instructions"),
    (req(tools=[{"type": "bogus_tool"}]), "tools[0].type"),
    (req(tools=[{"type": "custom", "name": "p", "format": {"type": "grammar", "syntax": "ebnf",
                                                           "definition": "x"}}]),
     "tools[0].format.syntax"),
    (req(tools=[{"type": "custom", "name": "p", "format": {"type": "grammar", "syntax": "lark",
                                                           "definition": "start: a\na: a \"x\""}}]),
     "tools[0].format.definition"),
    (req(tools=[{"type": "custom", "name": "p", "format": {"type": "regex"}}]),
     "tools[0].format.type"),
    (req(tools=[{"type": "namespace", "name": "mcp__x", "tools": [{"type": "web_search"}]}]),
     "tools[0].tools[0].type"),
    (req(tools=[{"type": "web_search"}], tool_choice={"type": "web_search"}), "tool_choice"),
    (req(tools=[{"type": "web_search"}], tool_choice="required"), "tool_choice"),
    (req(tools=[{"type": "function"}]), "tools[0].name"),
    (req(tools=[{"type": "function", "name": "bad name!"}]), "tools[0].name"),
    (req(tools=[{"type": "function", "name": "f", "parameters": 5}]), "tools[0].parameters"),
    (req(tools=[{"type": "function", "name": "f", "parameters": {"type": "nope"}}]),
     "tools[0].parameters"),
    (req(tools=[{"type": "function", "name": "f", "description": 5}]), "tools[0].description"),
    (req(tools=[{"type": "function", "name": "f", "strict": "yes"}]), "tools[0].strict"),
    (req(tools=[WEATHER, WEATHER]), "tools[1].name"),
    (req(tool_choice="sometimes"), "tool_choice"),
    (req(tool_choice="required"), "tool_choice"),
    (req(tools=[WEATHER], tool_choice={"type": "function", "name": "other"}), "tool_choice"),
    (req(tool_choice={"type": "web_search_preview"}), "tool_choice"),
    (req(parallel_tool_calls="x"), "parallel_tool_calls"),
    (req(max_output_tokens=0), "max_output_tokens"),
    (req(temperature=3), "temperature"),
    (req(top_p=2), "top_p"),
    (req(text={"format": {"type": "xml"}}), "text.format.type"),
    (req(text={"format": {"type": "json_schema", "name": "x"}}), "text.format.schema"),
    (req(text={"format": {"type": "json_schema", "name": "x", "schema": {"type": 5}}}),
     "text.format.schema"),
    (req(text={"verbosity": "loud"}), "text.verbosity"),
    (req(stream="maybe"), "stream"),
    (req(store="maybe"), "store"),
    (req(previous_response_id=5), "previous_response_id"),
    (req(metadata={"a": 5}), "metadata.a"),
    (req(metadata=[1]), "metadata"),
    (req(user=5), "user"),
    (req(reasoning={"effort": "extreme"}), "reasoning.effort"),
    (req(reasoning={"summary": "verbose"}), "reasoning.summary"),
    (req(background=True), "background"),
    (req(include=["message.output_text.logprobs"]), "include"),
    (req(input=[{"type": "reasoning", "summary": [], "encrypted_content": 5}]),
     "input[0].encrypted_content"),
    (req(input=[{"type": "custom_tool_call", "call_id": "c", "name": "p", "input": 5}]),
     "input[0].input"),
    (req(truncation="auto"), "truncation"),
    (req(conversation="conv_1"), "conversation"),
    (req(prompt={"id": "p"}), "prompt"),
    (req(top_logprobs=2), "top_logprobs"),
    (req(service_tier=5), "service_tier"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "param"), BAD, ids=[p for _, p in BAD])
async def test_bad_input_is_400_naming_the_field(
    client: httpx.AsyncClient, fake: FakeEngine, body: dict[str, Any], param: str
) -> None:
    assert_error(await client.post("/v1/responses", json=body), 400, param)
    assert fake.submitted == []


OPTIONAL = [f.alias or n for n, f in ResponsesRequest.model_fields.items() if not f.is_required()]


@pytest.mark.parametrize("name", OPTIONAL)
async def test_null_optional_field_is_absent(client: httpx.AsyncClient, name: str) -> None:
    r = await client.post("/v1/responses", json=req(**{name: None}))
    assert r.status_code == 200, r.text
