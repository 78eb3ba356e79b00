"""The HTTP layer counts generation requests as arriving at their model's engine until
they are queued or refused (engine/arrivals.py), and never leaves one counted."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from server.app import create_app
from server.config import Settings
from tests.fakes import FakeEngine

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def served() -> Any:
    engine = FakeEngine(reply="fine")
    app = create_app(Settings(), engine=engine)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        yield client, engine


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": MESSAGES}),
        ("/v1/chat/completions", {"messages": MESSAGES, "stream": True}),
        ("/v1/completions", {"prompt": "hi"}),
        ("/v1/responses", {"input": "hi"}),
        ("/v1/messages", {"messages": MESSAGES, "max_tokens": 8}),
    ],
)
async def test_each_generation_request_hands_its_ticket_to_the_engine(
    served: Any, path: str, body: dict[str, Any]
) -> None:
    client, engine = served
    r = await client.post(path, json={"model": "fake-model", **body})
    assert r.status_code == 200, r.text
    assert len(engine.tickets) == 1 and engine.tickets[0] is not None
    assert engine.arrivals.count == 0


@pytest.mark.parametrize(
    "body",
    [
        {"model": "fake-model", "messages": "not a list"},  # refused by the route: 400
        {"model": "fake-model", "messages": MESSAGES, "temperature": -3},
        {"model": "no-such-model", "messages": MESSAGES},  # 404, no engine to count on
        {"model": "fake-model", "messages": MESSAGES, "max_tokens": 10**9},  # the engine's 400
    ],
)
async def test_a_refused_request_leaves_nothing_counted(served: Any, body: dict[str, Any]) -> None:
    client, engine = served
    r = await client.post("/v1/chat/completions", json=body)
    assert 400 <= r.status_code < 500, r.text
    assert engine.arrivals.count == 0


async def test_embeddings_are_not_counted_as_arriving(served: Any) -> None:
    client, engine = served
    r = await client.post("/v1/embeddings", json={"model": "fake-model", "input": "hi"})
    assert r.status_code == 200, r.text
    assert engine.arrivals.count == 0 and engine.tickets == []
