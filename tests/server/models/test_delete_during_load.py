"""A pulled model deleted or unloaded while it loads, and a request arriving during its
delete (issue 28, item 5): nothing is left loaded that nobody serves. Fake engines, a
hub-cache layout on disk (no hub needed: the model is registered as discovery would)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.engine import EngineState
from server.app import create_app
from server.config.tree import HubSection, LoadingSection, ModelSection, Settings
from tests.fakes import FakeEngine
from tests.helpers.waiting import until

NAME = "hf.co/kvtest/tiny-GGUF:Q8_0"
CHAT = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


class Loading(FakeEngine):
    """Loads until `loaded` is set; its unload's wait blocks until `stopped` is set,
    its close (on a worker thread) until `closing` is."""

    def __init__(self, model_id: str) -> None:
        super().__init__(model_id=model_id)
        self.state = EngineState.UNLOADED
        self.loaded = asyncio.Event()
        self.stopped = threading.Event()
        self.stopped.set()
        self.closing = threading.Event()
        self.closing.set()
        self.num_starts = 0
        self.closed = False

    def start(self) -> None:
        self.num_starts += 1
        self.state = EngineState.LOADING
        asyncio.ensure_future(self._load())

    async def _load(self) -> None:
        await self.loaded.wait()
        if self.state is EngineState.LOADING:
            self.state = EngineState.READY

    def wait_stopped(self, timeout: float = 0) -> bool:
        return self.stopped.wait(30)

    def close(self, timeout: float = 0) -> None:
        assert self.closing.wait(30)
        super().close(timeout)
        self.closed, self.state = True, EngineState.STOPPED


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[Any]:
    hub = tmp_path / "hf"
    settings = Settings(
        models=(ModelSection(id="fake-model"),),
        hub=HubSection(cache_dir=str(hub)),
        loading=LoadingSection(wait_s=30),
    )
    app = create_app(settings, FakeEngine())
    app.state.hub_models.make_engine = lambda model_id, path: Loading(model_id)
    snapshot = hub / "models--kvtest--tiny-GGUF" / "snapshots" / "0123"
    snapshot.mkdir(parents=True)
    (snapshot / "tiny-Q8_0.gguf").write_bytes(b"GGUF" + b"\0" * 64)
    app.state.hub_models.register("kvtest/tiny-GGUF", str(snapshot / "tiny-Q8_0.gguf"))
    yield app


async def _client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


@pytest.mark.parametrize("by", ["load route", "request"])
async def test_delete_and_unload_during_a_load_are_refused_and_the_load_serves(
    app: Any, by: str
) -> None:
    """A load by hand is not a request in flight: its model was deleted (200), the load
    went on into an engine nobody served. A load for a request: refused alike."""
    served = app.state.models.get(NAME)
    engine: Loading = served.engine
    async with await _client(app) as c:
        if by == "request":
            chat = asyncio.create_task(c.post("/v1/chat/completions", json=CHAT))
        else:
            chat = asyncio.create_task(c.post(f"/v1/models/{NAME}/load"))
        await until(lambda: engine.state is EngineState.LOADING)
        r = await c.request("DELETE", "/api/delete", json={"model": NAME})
        assert r.status_code == 409, r.text
        assert "loading" in r.json()["error"] and r.headers["retry-after"] == "5"
        r = await c.post(f"/v1/models/{NAME}/unload")
        assert r.status_code == 409 and r.json()["error"]["code"] == "model_loading", r.text
        engine.loaded.set()
        r = await asyncio.wait_for(chat, 30)
        assert r.status_code == 200, r.text  # the load went on and served its request
        assert not engine.closed and engine.state is EngineState.READY
        r = await c.request("DELETE", "/api/delete", json={"model": NAME})
        assert r.status_code == 200, r.text
        assert engine.closed and app.state.models.get(NAME) is None
        names = [m["name"] for m in (await c.get("/api/tags")).json()["models"]]
        assert names == ["fake-model:latest"]


async def test_a_request_arriving_during_the_delete_loads_nothing(app: Any) -> None:
    served = app.state.models.get(NAME)
    engine: Loading = served.engine
    engine.loaded.set()
    async with await _client(app) as c:
        assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert engine.state is EngineState.READY and engine.num_starts == 1
        engine.stopped.clear()  # the delete's unload now waits for the engine thread
        delete = asyncio.create_task(c.request("DELETE", "/api/delete", json={"model": NAME}))
        await until(lambda: engine.state is EngineState.UNLOADED)
        chat = asyncio.create_task(c.post("/v1/chat/completions", json=CHAT))
        await until(lambda: served.in_flight == 1)  # leased, waiting for the load
        engine.closing.clear()
        engine.stopped.set()
        await until(lambda: app.state.models.get(NAME) is None)  # dropped, file still there
        # A rescan now (the hub cache is followed) must not serve the file again.
        names = [m["name"] for m in (await c.get("/api/tags")).json()["models"]]
        assert names == ["fake-model:latest"]
        engine.closing.set()
        assert (await asyncio.wait_for(delete, 30)).status_code == 200
        r = await asyncio.wait_for(chat, 30)
        # Not started again: no engine loaded for a model nobody serves.
        assert engine.num_starts == 1 and engine.closed
        assert engine.state is EngineState.STOPPED
        assert r.status_code == 404 and "deleted" in r.json()["error"]["message"], r.text
