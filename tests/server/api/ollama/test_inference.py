"""Ollama's inference routes (/api/chat, /api/generate, /api/embed, /api/embeddings,
/api/show) against the fake engine: shapes, NDJSON, options, names, and bad input
answered 4xx in Ollama's {"error": "..."} shape naming the field."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import AsyncIterator
from typing import Any

import httpx
import ollama
import pytest

from engine.client import EngineState
from server.api.ollama.common import resolve_ollama_model
from server.api.ollama.show import parameter_size
from server.config.tree import ModelNamesSection, Settings
from server.errors import BadRequest
from server.models.keep_alive import parse_keep_alive
from tests.conftest import ClientFactory
from tests.fakes import FakeEngine

MODEL = "fake-model"
REPLY = "Hello from the fake engine."
CALL = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}}  # fmt: skip
USER = [{"role": "user", "content": "Hi"}]
FIM = (300, 301, 302)


def _with(fake: FakeEngine, **info: Any) -> FakeEngine:
    fake._info = dataclasses.replace(fake._info, **info)
    return fake


@pytest.fixture
def fake() -> FakeEngine:
    meta = (("general.architecture", "llama"), ("general.file_type", "3"),
            ("general.license", "apache-2.0"))  # fmt: skip
    return _with(FakeEngine(n_ctx=1024), metadata=meta, embed_n_ctx=64)


async def lines(r: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(x) for x in r.text.splitlines() if x]


def assert_error(r: httpx.Response, status: int, *words: str) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert list(body) == ["error"] and isinstance(body["error"], str)
    for word in words:
        assert word in body["error"], body


# -- chat --------------------------------------------------------------------------------


async def test_chat_streams_ndjson_by_default(client: httpx.AsyncClient) -> None:
    r = await client.post("/api/chat", json={"model": MODEL, "messages": USER})
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
    parts = await lines(r)
    assert all(not p["done"] for p in parts[:-1]) and parts[-1]["done"] is True
    assert "".join(p["message"]["content"] for p in parts) == REPLY
    last = parts[-1]
    assert last["done_reason"] == "stop" and last["eval_count"] == len(REPLY) + 1
    for key in ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration"):
        assert isinstance(last[key], int) and last[key] >= 0
    assert last["total_duration"] >= last["eval_duration"] > 0
    assert last["model"] == MODEL and last["created_at"].endswith("Z")


async def test_chat_one_object_and_options(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    opts = {"num_predict": 5, "temperature": 0.2, "top_k": 7, "top_p": 0.5, "min_p": 0.1,
            "typical_p": 0.9, "seed": 42, "stop": ["zz"], "repeat_penalty": 1.3,
            "repeat_last_n": 32, "presence_penalty": 0.5, "frequency_penalty": 0.25}  # fmt: skip
    r = await client.post("/api/chat", json={"model": MODEL + ":latest", "messages": USER,
                                             "stream": False, "options": opts})  # fmt: skip
    body = r.json()
    assert body["message"] == {"role": "assistant", "content": REPLY[:5]}
    assert body["done_reason"] == "length" and body["model"] == MODEL + ":latest"
    sent = fake.submitted[-1]
    s = sent.sampling
    assert (s.temperature, s.top_k, s.top_p, s.min_p, s.typical_p, s.seed) == (
        0.2, 7, 0.5, 0.1, 0.9, 42)  # fmt: skip
    assert (s.repeat_penalty, s.repeat_last_n, s.presence_penalty, s.frequency_penalty) == (
        1.3, 32, 0.5, 0.25)  # fmt: skip
    assert sent.stop == ("zz",) and sent.max_tokens == 5


async def test_chat_defaults_are_ollamas(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    await client.post("/api/chat", json={"model": MODEL, "messages": USER, "stream": False})
    s = fake.submitted[-1].sampling
    assert (s.temperature, s.top_k, s.top_p, s.repeat_penalty, s.seed) == (0.8, 40, 0.9, 1.1,
                                                                           None)  # fmt: skip


async def test_num_ctx_bounds_the_answer(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    body = {"model": MODEL, "messages": USER, "stream": False}
    await client.post("/api/chat", json={**body, "options": {"num_ctx": 200}})
    prompt = len(fake.submitted[-1].prompt_tokens)
    assert fake.submitted[-1].max_tokens == 200 - prompt
    r = await client.post("/api/chat", json={**body, "options": {"num_ctx": prompt}})
    assert_error(r, 400, "options.num_ctx")


async def test_tool_calls_through_the_ollama_client(make_client: ClientFactory) -> None:
    fake = FakeEngine(reply=CALL, n_ctx=4096)
    app = make_client(fake)._transport.app  # type: ignore[attr-defined]
    client = ollama.AsyncClient(host="http://test", transport=httpx.ASGITransport(app=app))
    try:
        r = await client.chat(model=MODEL, messages=USER, tools=[WEATHER])
        (call,) = r.message.tool_calls or []
        assert call.function.name == "get_weather"
        assert call.function.arguments == {"city": "Paris"}
        assert r.done_reason == "stop" and not r.message.content
        parts = [p async for p in await client.chat(model=MODEL, messages=USER,
                                                     tools=[WEATHER], stream=True)]  # fmt: skip
        calls = [c for p in parts for c in p.message.tool_calls or []]
        assert [c.function.arguments for c in calls] == [{"city": "Paris"}]
    finally:
        await client._client.aclose()


async def test_tool_history_is_paired(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    messages = [*USER, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_name": "get_weather", "content": "sunny, 21C"}]  # fmt: skip
    r = await client.post("/api/chat", json={"model": MODEL, "messages": messages,
                                             "tools": [WEATHER], "stream": False})  # fmt: skip
    assert r.status_code == 200, r.text
    prompt = bytes(fake.submitted[-1].prompt_tokens).decode()
    assert '"city": "Paris"' in prompt and "sunny, 21C" in prompt


async def test_format_becomes_a_grammar(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    for fmt in ("json", schema):
        r = await client.post("/api/chat", json={"model": MODEL, "messages": USER,
                                                 "format": fmt, "stream": False})  # fmt: skip
        assert r.status_code == 200 and fake.submitted[-1].sampling.grammar
    r = await client.post("/api/chat", json={"model": MODEL, "messages": USER,
                                             "format": {"type": "nonsense"}})  # fmt: skip
    assert_error(r, 400, "format")


async def test_load_and_unload_answers(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    r = await client.post("/api/chat", json={"model": MODEL, "messages": []})
    assert r.json()["done_reason"] == "load" and r.json()["message"]["content"] == ""
    r = await client.post("/api/generate", json={"model": MODEL, "keep_alive": 0})
    assert r.json()["done_reason"] == "unload" and r.json()["response"] == ""
    served = client._transport.app.state.models.default  # type: ignore[attr-defined]
    assert fake.state is EngineState.UNLOADED
    assert served.keep_alive_s is None  # the unload it asked for is done: configured again
    r = await client.post("/api/generate", json={"model": MODEL, "keep_alive": -1})
    assert r.status_code == 200 and fake.ready  # the next request loads it again
    assert served.unload_after_s is None
    await client.post("/api/generate", json={"model": MODEL, "keep_alive": "1m30s"})
    assert served.unload_after_s == 90
    await client.post("/api/generate", json={"model": MODEL})  # none: it stays as set
    assert served.unload_after_s == 90
    assert not fake.submitted


async def test_midstream_failure_is_an_error_line(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    fake.fail_next = True
    r = await client.post("/api/generate", json={"model": MODEL, "prompt": "x"})
    assert r.status_code == 200
    assert "error" in (await lines(r))[-1]


# -- generate ----------------------------------------------------------------------------


async def test_generate_context_roundtrip(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    body = {"model": MODEL, "prompt": "Hi", "stream": False}
    first = (await client.post("/api/generate", json=body)).json()
    sent = list(fake.submitted[-1].prompt_tokens)
    assert first["response"] == REPLY and first["context"][: len(sent)] == sent
    assert bytes(first["context"][len(sent):]).decode() == REPLY
    r = await client.post("/api/generate", json={**body, "prompt": "More", "context":
                                                 first["context"]})  # fmt: skip
    again = list(fake.submitted[-1].prompt_tokens)
    assert again[: len(first["context"])] == first["context"]
    streamed = await lines(await client.post("/api/generate", json={
        **body, "stream": True, "context": r.json()["context"]}))  # fmt: skip
    assert streamed[-1]["context"][-len(REPLY):] == list(REPLY.encode())


async def test_generate_raw_and_system(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    await client.post("/api/generate", json={"model": MODEL, "prompt": "<b>x", "raw": True,
                                             "stream": False})  # fmt: skip
    assert bytes(fake.submitted[-1].prompt_tokens) == b"<b>x"
    await client.post("/api/generate", json={"model": MODEL, "prompt": "q", "system": "Be S.",
                                             "stream": False})  # fmt: skip
    assert b"Be S." in bytes(fake.submitted[-1].prompt_tokens)


async def test_suffix_fills_the_middle(make_client: ClientFactory) -> None:
    fake = _with(FakeEngine(), fim_tokens=FIM)
    client = make_client(fake)
    r = await client.post("/api/generate", json={"model": MODEL, "prompt": "ab", "suffix": "cd",
                                                 "stream": False})  # fmt: skip
    assert r.status_code == 200, r.text
    assert list(fake.submitted[-1].prompt_tokens) == [300, 97, 98, 301, 99, 100, 302]


# -- embed, show, names --------------------------------------------------------------------


async def test_embed_and_embeddings(client: httpx.AsyncClient) -> None:
    r = (await client.post("/api/embed", json={"model": MODEL, "input": ["a", "b"]})).json()
    assert len(r["embeddings"]) == 2 and r["prompt_eval_count"] == 2
    assert math.isclose(sum(x * x for x in r["embeddings"][0]), 1.0, rel_tol=1e-5)
    r = (await client.post("/api/embed", json={"model": MODEL, "input": "a", "dimensions": 3})).json()
    assert len(r["embeddings"][0]) == 3
    assert (await client.post("/api/embed", json={"model": MODEL, "input": ""})).json()[
        "embeddings"] == []  # fmt: skip
    long = "x" * 100  # 100 tokens, over the fake's 64
    r = await client.post("/api/embed", json={"model": MODEL, "input": long})
    assert r.status_code == 200
    r = await client.post("/api/embed", json={"model": MODEL, "input": long, "truncate": False})
    assert_error(r, 400, "input[0]", "truncate")
    r = (await client.post("/api/embeddings", json={"model": MODEL, "prompt": "a"})).json()
    assert len(r["embedding"]) == 8


async def test_show(client: httpx.AsyncClient) -> None:
    r = (await client.post("/api/show", json={"model": "FAKE-MODEL:latest"})).json()
    assert r["details"] == {"parent_model": "", "format": "gguf", "family": "llama",
                            "families": ["llama"], "parameter_size": "0",
                            "quantization_level": "Q4_1"}  # fmt: skip
    assert r["capabilities"] == ["completion", "tools", "embedding"]
    assert r["model_info"]["general.file_type"] == 3 and r["license"] == "apache-2.0"
    assert r["model_info"]["llama.context_length"] == 1024 and "im_start" in r["template"]


def test_parameter_size() -> None:
    assert [parameter_size(n) for n in (134_515_008, 7_615_616_512, 8_000_000_000, 494_032_768,
                                        3_000_000, 1500, 12)] == [
        "134.52M", "7.6B", "8B", "494.03M", "3M", "2K", "12"]  # fmt: skip


def test_names_resolve(client: httpx.AsyncClient) -> None:
    models = client._transport.app.state.models  # type: ignore[attr-defined]
    for name in ("fake-model", "fake-model:latest", "Fake-Model", "FAKE-MODEL:latest"):
        assert resolve_ollama_model(models, name) is models.default
    for name in ("fake-model:7b", "fake", ""):
        assert resolve_ollama_model(models, name) is None


def test_keep_alive_values() -> None:
    cases = {"5m": 300.0, "1h30m": 5400.0, "1.5s": 1.5, "300ms": 0.3, "0": 0.0, "30": 30.0, 0: 0.0,
             10: 10.0, 2.7: 2.0, -1: math.inf, "-1m": math.inf, "-1": math.inf}  # fmt: skip
    for value, seconds in cases.items():
        assert parse_keep_alive(value) == pytest.approx(seconds), value
    assert parse_keep_alive(None) is None
    for bad in ("5x", "five minutes", "5 m", "m", "", True, [1]):
        with pytest.raises(BadRequest) as err:
            parse_keep_alive(bad)
        assert err.value.param == "keep_alive"


# -- bad input, every route ---------------------------------------------------------------

CHAT = {"model": MODEL, "messages": USER, "stream": False}
GEN = {"model": MODEL, "prompt": "Hi", "stream": False}
BAD = [
    ("/api/chat", {**CHAT, "model": "nope"}, 404, 'model "nope" not found'),
    ("/api/chat", {"messages": USER}, 400, "model"),
    ("/api/chat", {**CHAT, "messages": [{"role": "robot", "content": "x"}]}, 400,
     "messages[0].role"),
    ("/api/chat", {**CHAT, "messages": [{"role": "user", "content": 5}]}, 400,
     "messages[0].content"),
    ("/api/chat", {**CHAT, "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]},
     400, "messages[0].images"),
    ("/api/chat", {**CHAT, "messages": [{"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "f", "arguments": "{}"}}]}]}, 400, "arguments"),
    ("/api/chat", {**CHAT, "tools": [{"type": "retrieval", "function": {"name": "f"}}]}, 400,
     "tools[0].type"),
    ("/api/chat", {**CHAT, "options": {"temperature": "hot"}}, 400, "options.temperature"),
    ("/api/chat", {**CHAT, "options": {"temperature": -1}}, 400, "options.temperature"),
    ("/api/chat", {**CHAT, "options": {"top_p": 2}}, 400, "options.top_p"),
    ("/api/chat", {**CHAT, "options": {"num_predict": -3}}, 400, "options.num_predict"),
    ("/api/chat", {**CHAT, "options": {"num_predict": 1.5}}, 400, "options.num_predict"),
    ("/api/chat", {**CHAT, "options": {"seed": "x"}}, 400, "options.seed"),
    ("/api/chat", {**CHAT, "options": {"num_ctx": 4096}}, 400, "options.num_ctx"),
    ("/api/chat", {**CHAT, "options": {"num_gpu": 1}}, 400, "options.num_gpu"),
    ("/api/chat", {**CHAT, "options": {"num_keep": 4}}, 400, "options.num_keep"),
    ("/api/chat", {**CHAT, "options": {"tfs_z": 1}}, 400, "options.tfs_z"),
    ("/api/chat", {**CHAT, "options": {"penalize_newline": True}}, 400,
     "options.penalize_newline"),
    ("/api/chat", {**CHAT, "options": {"bogus": 1}}, 400, "options.bogus"),
    ("/api/chat", {**CHAT, "options": "hot"}, 400, "options"),
    ("/api/chat", {**CHAT, "keep_alive": "soon"}, 400, "keep_alive"),
    ("/api/chat", {**CHAT, "format": "xml"}, 400, "format"),
    ("/api/chat", {**CHAT, "think": True}, 400, "think"),
    ("/api/chat", {**CHAT, "think": "high"}, 400, "think"),
    ("/api/chat", {**CHAT, "logprobs": True}, 400, "logprobs"),
    ("/api/chat", {**CHAT, "shift": True}, 400, "shift"),
    ("/api/chat", {**CHAT, "stream": "maybe"}, 400, "stream"),
    ("/api/generate", {**GEN, "model": "nope:latest"}, 404, "nope:latest"),
    ("/api/generate", {**GEN, "template": "{{ .Prompt }}"}, 400, "template"),
    ("/api/generate", {**GEN, "suffix": "end"}, 400, "does not support insert"),
    ("/api/generate", {**GEN, "raw": True, "system": "s"}, 400, "system"),
    ("/api/generate", {**GEN, "raw": True, "context": [1]}, 400, "context"),
    ("/api/generate", {**GEN, "context": [1, 99999]}, 400, "context"),
    ("/api/generate", {**GEN, "context": ["a"]}, 400, "context"),
    ("/api/generate", {**GEN, "images": ["aGk="]}, 400, "images"),
    ("/api/generate", {**GEN, "truncate": True}, 400, "truncate"),
    ("/api/generate", {**GEN, "width": 64}, 400, "width"),
    ("/api/generate", {**GEN, "prompt": "x" * 2000}, 400, "context"),
    ("/api/generate", {**GEN, "format": {"type": "integer", "minimum": "a"}}, 400, "format"),
    ("/api/generate", {**GEN, "options": {"use_mmap": False}}, 400, "options.use_mmap"),
    ("/api/embed", {"model": "nope", "input": "a"}, 404, "nope"),
    ("/api/embed", {"model": MODEL, "input": 5}, 400, "input"),
    ("/api/embed", {"model": MODEL, "input": ["a", ""]}, 400, "input[1]"),
    ("/api/embed", {"model": MODEL, "input": "a", "dimensions": 0}, 400, "dimensions"),
    ("/api/embed", {"model": MODEL, "input": "a", "dimensions": 9}, 400, "dimensions"),
    ("/api/embed", {"model": MODEL, "input": "a", "options": {"temperature": 1}}, 400,
     "options.temperature"),
    ("/api/embed", {"model": MODEL, "input": "a", "keep_alive": []}, 400, "keep_alive"),
    ("/api/embeddings", {"model": MODEL, "prompt": "x" * 100}, 400, "input"),
    ("/api/embeddings", {"model": MODEL, "prompt": ["a"]}, 400, "prompt"),
    ("/api/show", {}, 400, "model"),
    ("/api/show", {"model": "nope"}, 404, "nope"),
    ("/api/show", {"model": MODEL, "verbose": True}, 400, "verbose"),
]


@pytest.mark.parametrize(("path", "body", "status", "says"), BAD)
async def test_bad_input(
    make_client: ClientFactory, fake: FakeEngine, path: str, body: dict[str, Any], status: int,
    says: str,
) -> None:
    # Unknown names are 404s with [model_names] any_with_one_model off (else the one model).
    names = ModelNamesSection(any_with_one_model=False)
    client = make_client(fake, settings=Settings(model_names=names))
    r = await client.post(path, json=body)
    assert_error(r, status, says)


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate", "/api/embed", "/api/show"])
async def test_not_json(client: httpx.AsyncClient, path: str) -> None:
    r = await client.post(path, content=b"{nope", headers={"content-type": "application/json"})
    assert_error(r, 400, "JSON")


@pytest.fixture
async def keyed(make_client: ClientFactory, fake: FakeEngine) -> AsyncIterator[httpx.AsyncClient]:
    yield make_client(fake, api_keys=("sk-1",))


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate", "/api/embed",
                                  "/api/embeddings", "/api/show"])  # fmt: skip
async def test_api_keys_apply(keyed: httpx.AsyncClient, path: str) -> None:
    body = {"model": MODEL, "messages": USER, "prompt": "a", "input": "a", "stream": False}
    assert_error(await keyed.post(path, json=body), 401, "API key")
    r = await keyed.post(path, json=body, headers={"Authorization": "Bearer sk-1"})
    assert r.status_code == 200, r.text
