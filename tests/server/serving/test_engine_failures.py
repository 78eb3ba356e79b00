"""How sequences the engine ended with an error reach the client: a time limit is a
504 naming it (a stream: an error event with that code); a rebuilt engine is a 500."""

from __future__ import annotations

import json

import httpx

from engine.engine import EngineState
from engine.types import coded_error
from tests.conftest import ClientFactory
from tests.fakes import FakeEngine
from tests.server.api.test_openai_api import MODEL, assert_error, chat, sse_events


async def test_a_time_limit_is_504_naming_it(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    for code in ("prefill_timeout", "token_timeout", "total_timeout", "decode_timeout"):
        fake.fail_next = True
        fake.fail_error = coded_error(code, "the request ran past its limit (1 s)")
        r = await client.post("/v1/chat/completions", json=chat())
        error = assert_error(r, 504)
        assert error["code"] == code and error["type"] == "timeout"
    r = await client.post("/v1/chat/completions", json=chat())
    assert r.status_code == 200


async def test_a_time_limit_in_a_stream_is_an_error_event(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    fake.fail_next = True
    fake.fail_error = coded_error("token_timeout", "the request ran past its token limit")
    r = await client.post("/v1/chat/completions", json=chat(stream=True))
    error = json.loads(sse_events(r.text)[-1])["error"]
    assert error["code"] == "token_timeout"


async def test_a_rebuilt_engine_is_500_naming_the_cause(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    fake.fail_next = True
    fake.fail_error = coded_error("engine_restarted", "the engine failed (RuntimeError: x)")
    r = await client.post("/v1/completions", json={"model": MODEL, "prompt": "hi"})
    error = assert_error(r, 500)
    assert error["code"] == "engine_restarted" and "RuntimeError: x" in error["message"]


def test_a_request_during_a_rebuild_is_503_saying_so() -> None:
    from engine.types import EngineRecoveringError
    from server.errors import from_engine_error

    error = from_engine_error(EngineRecoveringError("the engine is being rebuilt"))
    assert error.status == 503 and error.code == "engine_recovering"
    assert error.headers == {"Retry-After": "1"}


async def test_health_is_503_recovering_while_the_engine_is_rebuilt(
    make_client: ClientFactory,
) -> None:
    engine = FakeEngine()
    c = make_client(engine)
    engine.state = EngineState.RECOVERING
    r = await c.get("/health")
    assert r.status_code == 503 and r.headers["Retry-After"] == "1"
    assert r.json() == {"status": "recovering", "models": {MODEL: {"status": "recovering"}}}
    engine.state = EngineState.READY
    assert (await c.get("/health")).status_code == 200
