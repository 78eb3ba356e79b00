"""A route's model dependency (server/http/lease.py): the request counts as in flight on
its model for its whole life, a stream's until its last byte; a cold stream's loading
notices come first, then the route's events or one error event."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send

from engine.client import EngineState
from server.app import create_app
from server.config.tree import LoadingSection, ModelNamesSection, ModelSection, Settings
from tests.fakes import FakeEngine
from tests.server.models.test_loader import SlowLoading

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def spied(app: Any, seen: list[tuple[str, int]]) -> Any:
    """`app`, recording the model's in-flight count as each response message leaves."""
    served = app.state.models.default

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        async def spy(message: Message) -> None:
            seen.append((message["type"], served.in_flight))
            await send(message)

        await app(scope, receive, spy)

    return wrapped


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/chat"])
async def test_a_stream_is_in_flight_until_its_last_byte(path: str) -> None:
    app = create_app(Settings(), engines={"fake-model": FakeEngine(delay=0.01)})
    seen: list[tuple[str, int]] = []
    transport = httpx.ASGITransport(app=spied(app, seen))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        body = {"model": "fake-model", "stream": True, **CHAT}
        response = await client.post(path, json=body)
    assert response.status_code == 200, response.text
    bodies = [count for kind, count in seen if kind == "http.response.body"]
    assert len(bodies) > 2 and all(count == 1 for count in bodies), seen
    assert app.state.models.default.in_flight == 0  # given back once the stream ended


async def test_a_refused_body_leases_nothing_and_loads_nothing() -> None:
    slow = SlowLoading("a")
    names = ModelNamesSection(any_with_one_model=False)  # else one model answers any name
    settings = Settings(models=(ModelSection(id="a", load="on_demand"),), model_names=names)
    app = create_app(settings, engines={"a": slow})
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        bad = {"model": "a", "messages": "not a list"}
        response = await client.post("/v1/chat/completions", json=bad)
        assert response.status_code == 400 and response.json()["error"]["param"] == "messages"
        response = await client.post("/v1/chat/completions", json={"model": "nope", **CHAT})
        assert response.status_code == 404
    assert slow.num_starts == 0 and slow.state is EngineState.UNLOADED
    assert app.state.models.default.in_flight == 0


async def test_a_cold_stream_refused_by_its_route_ends_in_one_error_event() -> None:
    """The 200 and the notices went out before the route ran: its refusal (here a prompt
    longer than the context, known once the model is there) is the last event."""
    slow = SlowLoading("a", load_s=1.2)
    settings = Settings(
        models=(ModelSection(id="a", load="on_demand"),), loading=LoadingSection(wait_s=5.0)
    )
    app = create_app(settings, engines={"a": slow})
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        long = [{"role": "user", "content": "word " * 2000}]
        body = {"model": "a", "stream": True, "messages": long}
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            status, headers = response.status_code, response.headers
            text = "".join([chunk async for chunk in response.aiter_text()])
        direct = await client.post("/v1/chat/completions", json=body)  # now warm: a 4xx
    assert status == 200 and text.startswith(": loading model a (")
    assert headers["content-type"].startswith("text/event-stream")
    assert "content-length" not in headers  # the stream's length is not known
    events = [line for line in text.splitlines() if line.startswith("data: ")]
    assert direct.status_code >= 400, direct.text
    assert len(events) == 1 and '"error"' in events[0], text
    assert direct.json()["error"]["message"] in events[0]
    assert app.state.models.default.in_flight == 0
