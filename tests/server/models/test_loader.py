"""On-demand loads, unloads and the memory budget, over fake engines that load slowly."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from engine.engine import EngineState
from server.app import create_app
from server.config.tree import AuthSection, LoadingSection, ModelSection, Settings
from tests.fakes import FakeEngine

KEY = "sk-load"
AUTH = {"Authorization": f"Bearer {KEY}"}


class SlowLoading(FakeEngine):
    """Loads in `load_s` (or fails with `fail`); unloads at once."""

    def __init__(self, model_id: str, *, load_s: float = 0.05, fail: str = "", size: int = 100):
        super().__init__(model_id=model_id, ready=False)
        self.load_s, self.fail, self.memory_bytes = load_s, fail, size
        self.state = EngineState.UNLOADED
        self.num_starts = 0

    def start(self) -> None:
        self.num_starts += 1
        self.state, self.load_progress = EngineState.LOADING, 0.0
        asyncio.get_running_loop().call_later(self.load_s, self._loaded)

    def _loaded(self) -> None:
        if self.fail:
            self.state, self.load_error = EngineState.FAILED, self.fail
        else:
            self.state, self.load_progress = EngineState.READY, 1.0


def _app(
    engines: dict[str, FakeEngine], budget: int = 0, wait_s: float = 5.0, idle: float = 0.0
) -> Any:
    models = tuple(ModelSection(id=i, load="on_demand", idle_unload_s=idle) for i in engines)
    settings = Settings(
        models=models,
        loading=LoadingSection(memory_budget_bytes=budget, wait_s=wait_s),
        auth=AuthSection(admin_api_keys=(KEY,)),  # loads and unloads by hand: an admin key
    )
    return create_app(settings, engines=engines)


@pytest.fixture
async def pair() -> AsyncIterator[tuple[httpx.AsyncClient, SlowLoading, SlowLoading, Any]]:
    a, b = SlowLoading("a"), SlowLoading("b")
    app = _app({"a": a, "b": b}, budget=150)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=AUTH) as c:
        yield c, a, b, app


def _chat(model: str, **kw: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **kw}


def _states(listing: dict[str, Any]) -> dict[str, str]:
    return {m["id"]: m["meta"]["state"] for m in listing["data"]}


async def test_requests_load_and_the_budget_unloads_the_idle_one(pair: Any) -> None:
    client, a, b, app = pair
    assert _states((await client.get("/v1/models")).json()) == {"a": "unloaded", "b": "unloaded"}
    assert (await client.get("/health")).status_code == 200  # on-demand models: still ready
    for model in ("a", "b", "a"):
        r = await client.post("/v1/chat/completions", json=_chat(model))
        assert r.status_code == 200, r.text
    # Each load of one unloaded the other: the budget fits one.
    assert _states((await client.get("/v1/models")).json()) == {"a": "loaded", "b": "unloaded"}
    assert (a.num_starts, b.num_starts) == (2, 1)
    text = (await client.get("/metrics")).text
    assert 'kvserve_model_loads_total{model="a"} 2.0' in text
    assert 'kvserve_model_unloads_total{model="a"} 1.0' in text
    assert 'kvserve_model_unloads_total{model="b"} 1.0' in text


async def test_a_stream_gets_comments_while_loading(pair: Any) -> None:
    client, a, _, _ = pair
    a.load_s = 1.5
    body = _chat("a", stream=True)
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        text = "".join([chunk async for chunk in r.aiter_text()])
    assert text.startswith(": loading model a (")
    assert '"object": "chat.completion.chunk"' in text or '"object":"chat.completion.chunk"' in text
    assert text.rstrip().endswith("data: [DONE]")


async def test_load_failure_is_a_503_with_the_reason_and_others_serve(pair: Any) -> None:
    client, a, _, _ = pair
    a.fail = "llama.cpp could not load the model at /x/corrupt.gguf"
    r = await client.post("/v1/chat/completions", json=_chat("a"))
    assert r.status_code == 503 and r.headers["retry-after"]
    assert "corrupt.gguf" in r.json()["error"]["message"]
    assert r.json()["error"]["code"] == "model_load_failed"
    assert (await client.post("/v1/chat/completions", json=_chat("b"))).status_code == 200
    card = (await client.get("/v1/models/a")).json()
    assert card["meta"]["state"] == "failed" and "corrupt" in card["meta"]["error"]
    # a stream is told in an error event
    async with client.stream("POST", "/v1/chat/completions", json=_chat("a", stream=True)) as s:
        body = "".join([chunk async for chunk in s.aiter_text()])
    assert '"code": "model_load_failed"' in body


async def test_wait_limit_then_503() -> None:
    slow = SlowLoading("a", load_s=30)
    app = _app({"a": slow}, wait_s=0.3)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://t", headers=AUTH
    ) as client:
        r = await client.post("/v1/completions", json={"model": "a", "prompt": "x"})
    assert r.status_code == 503 and r.headers["retry-after"] == "5"
    assert r.json()["error"]["code"] == "model_loading"


async def test_load_and_unload_by_hand(pair: Any) -> None:
    client, a, _, _ = pair
    r = await client.post("/v1/models/a/load")
    assert r.status_code == 200 and r.json()["meta"]["state"] == "loaded"
    a.outstanding = 1  # a request in flight: not unloaded
    r = await client.post("/v1/models/a/unload")
    assert r.status_code == 409 and r.json()["error"]["code"] == "model_busy"
    a.outstanding = 0
    r = await client.post("/v1/models/a/unload")
    assert r.status_code == 200 and r.json()["meta"]["state"] == "unloaded"
    assert (await client.post("/v1/models/nope/load")).status_code == 404
    anonymous = {"Authorization": ""}
    assert (await client.post("/v1/models/a/load", headers=anonymous)).status_code == 401
    r = await client.post("/v1/chat/completions", json=_chat("a"), headers=anonymous)
    assert r.status_code == 401 and a.state is EngineState.UNLOADED  # nothing loaded for it


async def test_a_session_outlives_an_unload_and_a_fork_loads_the_model(pair: Any) -> None:
    """Issue 17, item 10: sessions and the cache work on unloaded models (the normal
    state of an on-demand one); only a fork, which needs an engine, loads the model."""
    client, a, b, _ = pair
    r = await client.post("/v1/chat/completions", json=_chat("a", session_id="kept"))
    assert r.status_code == 200 and a.state is EngineState.READY
    assert (await client.post("/v1/models/a/unload")).status_code == 200
    assert (a.state, b.state) == (EngineState.UNLOADED, EngineState.UNLOADED)
    r = await client.get("/v1/sessions")
    assert r.status_code == 200 and [s["id"] for s in r.json()["data"]] == ["kept"]
    assert (await client.get("/v1/sessions/kept")).json()["model"] == "a"
    r = await client.post("/v1/sessions", json={"model": "b", "id": "new"})
    assert r.status_code == 200 and b.state is EngineState.UNLOADED  # nothing to load yet
    assert (await client.get("/v1/cache")).status_code == 200
    r = await client.delete("/v1/cache")
    assert r.status_code == 200 and r.json()["entries_removed"] == 1  # the chat's prefix
    r = await client.post("/v1/sessions/kept/fork", json={"id": "twin"})
    assert r.status_code == 200 and a.state is EngineState.READY, r.text
    for session in ("kept", "twin", "new"):
        assert (await client.delete(f"/v1/sessions/{session}")).status_code == 200
    assert (await client.get("/v1/sessions")).json()["data"] == []


async def test_budget_refuses_when_nothing_is_idle(pair: Any) -> None:
    client, a, b, _ = pair
    assert (await client.post("/v1/models/a/load")).status_code == 200
    a.outstanding = 1
    r = await client.post("/v1/chat/completions", json=_chat("b"))
    assert r.status_code == 503 and r.json()["error"]["code"] == "memory_budget"
    assert a.state is EngineState.READY and b.state is EngineState.UNLOADED


async def test_idle_unload() -> None:
    a = SlowLoading("a")
    app = _app({"a": a}, idle=0.3)
    task = asyncio.create_task(app.state.loader.run())
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t", headers=AUTH
        ) as client:
            assert (
                await client.post("/v1/completions", json={"model": "a", "prompt": "x"})
            ).status_code == 200
            assert a.state is EngineState.READY
            await asyncio.sleep(1.2)
            assert a.state is EngineState.UNLOADED
    finally:
        task.cancel()


def test_bad_loading_config() -> None:
    from server.config.tree import ConfigError, load_settings

    for overrides, message in (
        ({"model.load": "lazy"}, "load: one of startup, on_demand"),
        ({"model.idle_unload_s": -1.0}, "idle_unload_s: must not be negative"),
        ({"loading.wait_s": 0.0}, "loading.wait_s: must be above 0"),
        ({"loading.memory_budget_bytes": -1}, "memory_budget_bytes: must not be negative"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_settings(env={}, overrides=overrides)
    s = load_settings(env={}, overrides={"model.load": "on_demand"})
    assert dataclasses.astuple(s.loading) == (0, 120.0) and s.models[0].load == "on_demand"


class BlockingTokenizer(SlowLoading):
    """Its tokenize of a long text waits for `release` (a worker thread runs it)."""

    def __init__(self, model_id: str) -> None:
        super().__init__(model_id)
        self.release = threading.Event()
        self.tokenizing = threading.Event()

    def tokenize(self, text: str, **kw: Any) -> list[int]:
        if len(text) > 10_000:
            self.tokenizing.set()
            assert self.release.wait(10)
        return super().tokenize(text, **kw)


def _count(model: str, text: str = "hi") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}]}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/messages/count_tokens", _count("a")),
        ("/v1/cache/warm", {"model": "a", "prompt": "hello"}),
        ("/tokenize", {"content": "hello"}),  # the default model: the first, "a"
        ("/detokenize", {"tokens": [104, 105]}),
    ],
)
async def test_every_route_that_uses_an_engine_loads_its_model(
    pair: Any, path: str, body: dict[str, Any]
) -> None:
    client, a, _, _ = pair
    r = await client.post(path, json=body)
    assert r.status_code == 200, r.text
    assert a.state is EngineState.READY and a.num_starts == 1


async def test_no_unload_during_a_long_tokenize_and_it_counts_as_use() -> None:
    a = BlockingTokenizer("a")
    app = _app({"a": a})
    served = app.state.models.get("a")
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://t", headers=AUTH
    ) as client:
        assert (await client.post("/v1/models/a/load")).status_code == 200
        before = served.last_used
        counting = asyncio.create_task(
            client.post("/v1/messages/count_tokens", json=_count("a", "x" * 20_000))
        )
        assert await asyncio.to_thread(a.tokenizing.wait, 5)
        assert served.in_flight == 1 and served.last_used > before
        # The tokenize reads the model's vocabulary: no unload may free it meanwhile.
        r = await client.post("/v1/models/a/unload")
        assert r.status_code == 409 and a.state is EngineState.READY
        a.release.set()
        r = await counting
        assert r.status_code == 200 and r.json()["input_tokens"] > 20_000
        assert served.in_flight == 0


async def test_a_failed_load_is_not_tried_again_by_every_request(
    pair: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, a, _, _ = pair
    a.fail = "llama.cpp could not load the model at /x/corrupt.gguf"
    for _ in range(3):  # each attempt reads the whole file: one, then the Retry-After
        r = await client.post("/v1/chat/completions", json=_chat("a"))
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_load_failed"
        assert r.headers["retry-after"] == "10"
    assert a.num_starts == 1
    assert (await client.post("/v1/models/a/load")).status_code == 503  # by hand: at once
    assert a.num_starts == 2
    monkeypatch.setattr("server.models.loader.RETRY_FAILED_S", 0.0)  # ... the Retry-After later
    a.fail = ""
    assert (await client.post("/v1/chat/completions", json=_chat("a"))).status_code == 200
    assert a.num_starts == 3


async def test_a_rebuilding_engine_is_listed_and_load_waits_for_it(pair: Any) -> None:
    client, a, _, _ = pair
    assert (await client.post("/v1/models/a/load")).status_code == 200
    a.state = EngineState.RECOVERING  # the engine thread died and is being rebuilt
    r = await client.get("/v1/models")
    assert r.status_code == 200 and _states(r.json())["a"] == "recovering"
    assert (await client.get("/v1/models/a")).json()["meta"]["state"] == "recovering"
    r = await client.post("/v1/models/a/unload")
    assert r.status_code == 503 and r.json()["error"]["code"] == "engine_recovering"
    asyncio.get_running_loop().call_later(0.3, setattr, a, "state", EngineState.READY)
    r = await client.post("/v1/models/a/load")  # no second load: it waits for the rebuild
    assert r.status_code == 200 and r.json()["meta"]["state"] == "loaded"
    assert a.num_starts == 1
