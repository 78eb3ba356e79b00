"""Streams keep their client's idle watchdog fed while a long prompt is prefilled: the
heartbeat is an event of the API's own, not an SSE comment (agents count events)."""

from __future__ import annotations

import json

import pytest

from server.serving import sse
from tests.conftest import ClientFactory
from tests.fakes import FakeEngine
from tests.server.api.responses.test_responses import named_events
from tests.server.api.test_openai_api import MODEL, REPLY


@pytest.fixture
def slow_prefill(monkeypatch: pytest.MonkeyPatch) -> FakeEngine:
    monkeypatch.setattr(sse, "HEARTBEAT_S", 0.1)
    fake = FakeEngine()
    fake.prefill_delay = 0.5
    return fake


async def test_anthropic_stream_pings_during_prefill(
    make_client: ClientFactory, slow_prefill: FakeEngine
) -> None:
    client = make_client(slow_prefill)
    body = {"model": MODEL, "max_tokens": 64, "stream": True,
            "messages": [{"role": "user", "content": "Hi"}]}  # fmt: skip
    r = await client.post("/v1/messages", json=body)
    assert r.status_code == 200
    assert not any(line.startswith(":") for line in r.text.splitlines())  # no comments
    names = [name for name, _ in named_events(r.text)]
    first_block = names.index("content_block_start")
    assert names[0] == "message_start"
    assert names[1:first_block].count("ping") >= 3, names  # 0.5 s of prefill, every 0.1 s
    assert names[-1] == "message_stop"


async def test_chat_stream_sends_empty_deltas_during_prefill(
    make_client: ClientFactory, slow_prefill: FakeEngine
) -> None:
    client = make_client(slow_prefill)
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
    r = await client.post("/v1/chat/completions", json=body)
    assert not any(line.startswith(":") for line in r.text.splitlines())
    chunks = [json.loads(line[6:]) for line in r.text.splitlines()
              if line.startswith("data: {")]  # fmt: skip
    beats = [c for c in chunks if c["choices"] == [
        {"index": 0, "delta": {}, "logprobs": None, "finish_reason": None}]]  # fmt: skip
    assert len(beats) >= 3
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"]
               for c in beats)  # fmt: skip
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == REPLY


async def test_responses_stream_repeats_in_progress_during_prefill(
    make_client: ClientFactory, slow_prefill: FakeEngine
) -> None:
    client = make_client(slow_prefill)
    body = {"model": MODEL, "stream": True, "input": "Hi"}
    r = await client.post("/v1/responses", json=body)
    assert not any(line.startswith(":") for line in r.text.splitlines())
    events = named_events(r.text)
    names = [name for name, _ in events]
    assert names[:2] == ["response.created", "response.in_progress"]
    first_item = names.index("response.output_item.added")
    assert names[2:first_item].count("response.in_progress") >= 3, names
    assert names[-1] == "response.completed"
    numbers = [data["sequence_number"] for _, data in events]
    assert numbers == list(range(len(numbers)))  # one count for the events and the beats
