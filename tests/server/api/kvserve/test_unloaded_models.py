"""Sessions and the cache on models that are not loaded (issue 17, item 10): an on-demand
model not loaded yet (its normal state) and a model whose load failed, on real engines
that never load a model (their file is not a GGUF), beside a fake that serves."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import httpx

from cache import CacheConfig
from engine.engine import Engine, EngineConfig, EngineState
from server.app import create_app
from server.config.tree import AuthSection, ModelSection, Settings
from tests.fakes import FakeEngine

A, ROOT = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer root"}
TENANT = hashlib.sha256(b"key-a").hexdigest()[:16]  # server.http.deps.get_caller's digest
TOKENS = [5, 6, 7, 8, 9]


def _engine(path: Path, kv: Path) -> Engine:
    cache = CacheConfig(disk_dir=str(kv), block_tokens=4, min_tokens=4)
    return Engine(EngineConfig(model_path=str(path), model_id=path.stem, cache=cache))


def _from_an_earlier_run(path: Path, kv: Path) -> None:
    """What a previous process left on disk: a prefix of key-a's on the model `path`."""
    engine = _engine(path, kv)
    engine.open_cache()  # a cache needs no loaded model
    assert engine._cache is not None
    assert engine._cache.save(TOKENS, b"state" * 10, salt=TENANT)
    assert engine._cache.flush(timeout=10)
    engine.close()


async def test_sessions_and_cache_answer_for_unloaded_and_failed_models(tmp_path: Path) -> None:
    idle_file, broken_file = tmp_path / "idle.gguf", tmp_path / "broken.gguf"
    idle_file.write_bytes(b"not a gguf" * 1000)
    broken_file.write_bytes(b"nor this" * 1000)
    kv = tmp_path / "kv"
    _from_an_earlier_run(idle_file, kv)
    idle, broken = _engine(idle_file, kv), _engine(broken_file, kv)
    settings = Settings(
        models=(
            ModelSection(id="main"),
            ModelSection(id="idle", load="on_demand"),
            ModelSection(id="broken"),
        ),
        auth=AuthSection(api_keys=("key-a",), admin_api_keys=("root",)),
    )
    engines = {"main": FakeEngine(model_id="main"), "idle": idle, "broken": broken}
    app = create_app(settings, engines=engines)  # type: ignore[arg-type]
    broken.start()  # (the app's lifespan would; the test client runs none)
    while broken.state is EngineState.LOADING:
        await asyncio.sleep(0.01)
    assert (idle.state, broken.state) == (EngineState.UNLOADED, EngineState.FAILED)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t"
        ) as c:
            for model in ("idle", "broken"):
                r = await c.post("/v1/sessions", json={"model": model, "id": model}, headers=A)
                assert r.status_code == 200 and r.json()["model"] == model, r.text
            r = await c.get("/v1/sessions", headers=A)
            assert r.status_code == 200, r.text
            assert {s["id"]: s["model"] for s in r.json()["data"]} == {
                "idle": "idle",
                "broken": "broken",
            }
            assert (await c.get("/v1/sessions/idle", headers=A)).json()["resident"] is False
            # the tenant sees, then purges, its prefix of the earlier run
            r = await c.get("/v1/cache", headers=A)
            assert r.status_code == 200, r.text
            mine = {m["model"]: m["entries"] for m in r.json()["data"]}
            assert mine == {"main": 0, "idle": 1, "broken": 0}
            r = await c.get("/v1/cache", headers=ROOT)
            assert r.status_code == 200, r.text
            server = {m["model"]: m for m in r.json()["data"]}
            assert server["idle"]["enabled"] and server["idle"]["disk"]["entries"] == 1
            r = await c.delete("/v1/cache", headers=A)
            assert r.status_code == 200 and r.json()["entries_removed"] == 1, r.text
            for model in ("idle", "broken"):
                r = await c.delete(f"/v1/sessions/{model}", headers=A)
                assert r.status_code == 200, r.text
            assert (await c.get("/v1/sessions", headers=A)).json()["data"] == []
            # a fork needs a loaded engine: the failed load is a 503, never a 500 or a hang
            await c.post("/v1/sessions", json={"model": "broken", "id": "b"}, headers=A)
            r = await c.post("/v1/sessions/b/fork", json={}, headers=A)
            assert r.status_code == 503, r.text
    finally:
        idle.close()
        broken.close()
    # purged on disk: the next run does not find it
    later = _engine(idle_file, kv)
    later.open_cache()
    assert later._cache is not None and later._cache.lookup(TOKENS, TENANT) is None
    later.close()
