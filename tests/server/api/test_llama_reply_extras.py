"""llama-server's reply extras on chat and completions, against the fake engine:
`return_tokens` (the sampled ids in each choice's `tokens`) and `timings_per_token`
(the `timings` object, on the reply or a stream's last chunk). The fake's tokens are the
reply's UTF-8 bytes."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.fakes import FakeEngine
from tests.server.api.test_openai_api import MODEL, REPLY, assert_error, chat, sse_events

TIMINGS = {"cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second",
           "predicted_n", "predicted_ms", "predicted_per_token_ms", "predicted_per_second"}  # fmt: skip


def completion(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "Hi", "max_tokens": 64, **extra}


def chunks(r: httpx.Response) -> list[dict[str, Any]]:
    assert r.status_code == 200, r.text
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


async def test_chat_return_tokens(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", json=chat(return_tokens=True))
    (choice,) = r.json()["choices"]
    assert choice["tokens"] == list(REPLY.encode())
    (choice,) = (await client.post("/v1/chat/completions", json=chat())).json()["choices"]
    assert "tokens" not in choice
    r = await client.post("/v1/chat/completions", json=chat(return_tokens=True, stream=True))
    parts = [c for chunk in chunks(r) for c in chunk["choices"] if "tokens" in c]
    assert parts and sum((p["tokens"] for p in parts), []) == list(REPLY.encode())
    for p in parts:  # each part's ids are the text it carries
        assert bytes(p["tokens"]).decode() == p["delta"].get("content", "")


async def test_completion_return_tokens(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/completions", json=completion(return_tokens=True))
    assert r.json()["choices"][0]["tokens"] == list(REPLY.encode())
    r = await client.post("/v1/completions", json=completion())
    assert "tokens" not in r.json()["choices"][0]
    r = await client.post("/v1/completions", json=completion(return_tokens=True, stream=True))
    parts = [c for chunk in chunks(r) for c in chunk["choices"] if "tokens" in c]
    assert sum((p["tokens"] for p in parts), []) == list(REPLY.encode())
    assert all(bytes(p["tokens"]).decode() == p["text"] for p in parts)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_timings_agree_with_usage(
    client: httpx.AsyncClient, fake: FakeEngine, path: str
) -> None:
    fake.cached = 1  # of the prompt's tokens ("Hi": 2 with the fake)
    body = chat if path.endswith("chat/completions") else completion
    reply = (await client.post(path, json=body(timings_per_token=True, n=2))).json()
    timings, usage = reply["timings"], reply["usage"]
    assert set(timings) == TIMINGS
    assert timings["cache_n"] == 1 and timings["prompt_n"] == usage["prompt_tokens"] - 1
    assert timings["predicted_n"] == usage["completion_tokens"]
    assert all(v >= 0 for v in timings.values())
    assert "timings" not in (await client.post(path, json=body())).json()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("include_usage", [False, True])
async def test_timings_on_a_streams_last_chunk(
    client: httpx.AsyncClient, path: str, include_usage: bool
) -> None:
    body = chat if path.endswith("chat/completions") else completion
    options = {"stream_options": {"include_usage": True}} if include_usage else {}
    r = await client.post(path, json=body(timings_per_token=True, stream=True, **options))
    events = chunks(r)
    assert [i for i, e in enumerate(events) if "timings" in e] == [len(events) - 1]
    last = events[-1]
    assert set(last["timings"]) == TIMINGS
    if include_usage:
        assert last["choices"] == []
        assert last["timings"]["predicted_n"] == last["usage"]["completion_tokens"]
    else:
        assert last["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize(
    ("field", "value"), [("return_tokens", "maybe"), ("timings_per_token", [1])]
)
async def test_bad_flags(client: httpx.AsyncClient, path: str, field: str, value: Any) -> None:
    body = chat if path.endswith("chat/completions") else completion
    assert_error(await client.post(path, json=body(**{field: value})), 400, field)
