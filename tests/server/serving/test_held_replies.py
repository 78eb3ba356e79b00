"""A reply read whole asks the engine to hold its outputs (engine/thread/holding.py); a
streamed one does not: every API's non-streamed route goes through `drive.collect`."""

from __future__ import annotations

import httpx
import pytest

from tests.fakes import FakeEngine

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "go"}]}
ROUTES = [
    ("/v1/chat/completions", CHAT),
    ("/v1/completions", {"model": "fake-model", "prompt": "go"}),
    ("/v1/messages", {**CHAT, "max_tokens": 16}),
    ("/v1/responses", {"model": "fake-model", "input": "go"}),
    ("/api/chat", {**CHAT, "stream": False}),
    ("/api/generate", {"model": "fake-model", "prompt": "go", "stream": False}),
]


@pytest.mark.parametrize(("path", "body"), ROUTES, ids=[p for p, _ in ROUTES])
async def test_a_reply_read_whole_is_held(
    client: httpx.AsyncClient, fake: FakeEngine, path: str, body: dict
) -> None:
    r = await client.post(path, json=body)
    assert r.status_code == 200, r.text
    assert fake.held == [fake.submitted[-1].request_id]


@pytest.mark.parametrize(("path", "body"), ROUTES[:4], ids=[p for p, _ in ROUTES[:4]])
async def test_a_streamed_reply_is_not(
    client: httpx.AsyncClient, fake: FakeEngine, path: str, body: dict
) -> None:
    r = await client.post(path, json={**body, "stream": True})
    assert r.status_code == 200, r.text
    assert fake.submitted and fake.held == []
