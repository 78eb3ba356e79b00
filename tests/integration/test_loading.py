"""Two real models (the same GGUF under two ids) under a memory budget that fits one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine import CacheConfig
from engine.settings import EngineSettings
from server.app import create_app
from server.config.tree import LoadingSection, ModelSection, Settings, default_model_path

pytestmark = pytest.mark.model

# Exact reuse: a model reloaded warm must answer exactly as it did cold.
ENGINE = EngineSettings(n_ctx=512, n_seq_max=1, n_threads=2, embeddings=False, exact_reuse=True)
# One model: ~97 MB of weights + ~12 MB of KV at 512 cells. Two do not fit.
BUDGET = 160 * 1024 * 1024
LONG = "Tell me about the history of the city of Paris, its bridges and its river. " * 6


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + b"\x00" * 4096)
    models = tuple(
        ModelSection(id=i, path=p, load="on_demand", engine=ENGINE)
        for i, p in (
            ("a", default_model_path()),
            ("b", default_model_path()),
            ("bad", str(corrupt)),
        )
    )
    settings = Settings(
        models=models,
        loading=LoadingSection(memory_budget_bytes=BUDGET, wait_s=120),
        cache=CacheConfig(disk_dir="auto", block_tokens=16, min_tokens=16),
    )
    app = create_app(settings)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=120) as c:
        yield c, app
    for served in app.state.models:
        served.engine.close()


async def ask(c: httpx.AsyncClient, model: str, messages: list, **kw: Any) -> dict[str, Any]:
    body = {"model": model, "messages": messages, "max_tokens": 12, "temperature": 0, **kw}
    r = await c.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def _states(listing: dict[str, Any]) -> dict[str, str]:
    return {m["id"]: m["meta"]["state"] for m in listing["data"]}


async def test_alternating_models_answer_as_cold_and_resume_warm(client: Any) -> None:
    c, _ = client
    q_a = [{"role": "user", "content": LONG + "Answer in one word."}]
    q_b = [{"role": "user", "content": "Name a colour."}]
    cold_a = (await ask(c, "a", q_a))["choices"][0]["message"]["content"]
    cold_b = (await ask(c, "b", q_b))["choices"][0]["message"]["content"]
    assert _states((await c.get("/v1/models")).json())["a"] == "unloaded"
    for _ in range(2):
        assert (await ask(c, "a", q_a))["choices"][0]["message"]["content"] == cold_a
        assert (await ask(c, "b", q_b))["choices"][0]["message"]["content"] == cold_b
    states = _states((await c.get("/v1/models")).json())
    assert (states["a"], states["b"]) == ("unloaded", "loaded")

    # A session on a, then b (a is unloaded, its slot saved), then a again: warm.
    first = await ask(c, "a", q_a, session_id="s1")
    reply = first["choices"][0]["message"]["content"]
    await ask(c, "b", q_b)
    assert _states((await c.get("/v1/models")).json())["a"] == "unloaded"
    turn2 = [*q_a, {"role": "assistant", "content": reply}, {"role": "user", "content": "Why?"}]
    second = await ask(c, "a", turn2, session_id="s1")
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0

    metrics = (await c.get("/metrics")).text
    assert 'kvserve_model_unloads_total{model="a"}' in metrics


async def test_a_failed_load_is_a_503_and_the_others_serve(client: Any) -> None:
    c, _ = client
    r = await c.post(
        "/v1/chat/completions",
        json={"model": "bad", "messages": [{"role": "user", "content": "x"}]},
    )
    assert r.status_code == 503 and "retry-after" in r.headers
    assert "corrupt.gguf" in r.json()["error"]["message"]
    answer = await ask(c, "a", [{"role": "user", "content": "Name a colour."}])
    assert answer["choices"][0]["message"]["content"]
