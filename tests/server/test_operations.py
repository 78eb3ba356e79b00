"""Several models, metrics after traffic, access records, draining — over fake engines."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.engine import EngineState
from server.app import create_app
from server.config.tree import LoadingSection, ModelSection, Settings
from server.telemetry.logs import JsonFormatter
from tests.fakes import FakeEngine

REPLY = "hello"  # five tokens, one output each; the fake counts its EOS as a sixth
NUM_OUT = len(REPLY) + 1


def chat(model: str, **extra: object) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "Hi"}], **extra}


@pytest.fixture
def engines() -> dict[str, FakeEngine]:
    return {
        "a": FakeEngine(reply=REPLY, model_id="a"),
        "b": FakeEngine(reply="bye", model_id="b", n_seq_max=1, max_queue=0),
    }


@pytest.fixture
async def two(engines: dict[str, FakeEngine]) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(
        models=(
            ModelSection(id="a", aliases=("gpt-4o-mini",)),
            ModelSection(id="b", chat_template="{% for m in messages %}B:{{ m.content }}{% endfor %}"),
        ),
        loading=LoadingSection(wait_s=0.2),  # a model set loading by hand never loads
    )
    app = create_app(settings, engines=engines)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://test"
    ) as client:
        client.app = app  # type: ignore[attr-defined]
        yield client


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(metrics: dict, name: str, **labels: str) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_requests_are_routed_by_model_id_and_alias(
    two: httpx.AsyncClient, engines: dict[str, FakeEngine]
) -> None:
    r = await two.post("/v1/chat/completions", json=chat("a"))
    assert r.json()["choices"][0]["message"]["content"] == REPLY and r.json()["model"] == "a"
    r = await two.post("/v1/chat/completions", json=chat("gpt-4o-mini"))
    assert r.json()["model"] == "a"
    r = await two.post("/v1/completions", json={"model": "b", "prompt": "x"})
    assert r.json()["choices"][0]["text"] == "bye" and r.json()["model"] == "b"
    # Each model renders with its own template.
    await two.post("/v1/chat/completions", json=chat("b"))
    assert bytes(engines["b"].submitted[-1].prompt_tokens) == b"B:Hi"
    assert bytes(engines["a"].submitted[-1].prompt_tokens).startswith(b"<|im_start|>")
    assert len(engines["a"].submitted) == 2
    r = await two.post("/v1/embeddings", json={"model": "b", "input": "x"})
    assert r.status_code == 200 and r.json()["model"] == "b"
    r = await two.post("/v1/chat/completions", json=chat("c"))
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert r.json()["error"]["param"] == "model"


async def test_models_list_and_health_cover_every_model(
    two: httpx.AsyncClient, engines: dict[str, FakeEngine]
) -> None:
    listed = (await two.get("/v1/models")).json()["data"]
    assert [m["id"] for m in listed] == ["a", "b"]
    assert listed[0]["meta"]["aliases"] == ["gpt-4o-mini"]
    assert (await two.get("/v1/models/gpt-4o-mini")).json()["id"] == "a"
    assert (await two.get("/v1/models/zzz")).status_code == 404
    assert (await two.get("/health")).json()["models"] == {
        "a": {"status": "ready"},
        "b": {"status": "ready"},
    }
    engines["b"].state = EngineState.LOADING
    engines["b"].load_progress = 0.5
    r = await two.get("/health")
    assert r.status_code == 503
    assert r.json()["status"] == "loading" and r.json()["progress"] == 0.75
    assert r.json()["models"]["b"] == {"status": "loading", "progress": 0.5}
    # The ready model serves while the other loads.
    assert (await two.post("/v1/chat/completions", json=chat("a"))).status_code == 200
    r = await two.post("/v1/chat/completions", json=chat("b"))
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_loading"
    assert [m["meta"]["ready"] for m in (await two.get("/v1/models")).json()["data"]] == [True, False]
    engines["b"].state = EngineState.FAILED
    engines["b"].load_error = "bad file"
    assert (await two.get("/health")).json()["models"]["b"] == {"status": "error", "error": "bad file"}


async def test_metrics_move_with_traffic(
    two: httpx.AsyncClient, engines: dict[str, FakeEngine]
) -> None:
    before = samples((await two.get("/metrics")).text)
    assert value(before, "kvserve_time_to_first_token_seconds_count", model="a") == 0
    await two.post("/v1/chat/completions", json=chat("a"))
    await two.post("/v1/chat/completions", json=chat("gpt-4o-mini", n=2))
    r = await two.post("/v1/chat/completions", json=chat("a", stream=True))
    assert r.text.rstrip().endswith("data: [DONE]")
    await two.post("/v1/completions", json={"model": "b", "prompt": "xyz"})
    await two.post("/v1/chat/completions", json=chat("nope"))
    engines["b"].outstanding = 1  # its single slot busy, no queue: 429
    assert (await two.post("/v1/completions", json={"model": "b", "prompt": "x"})).status_code == 429

    m = samples((await two.get("/metrics")).text)
    assert value(m, "kvserve_time_to_first_token_seconds_count", model="a") == 3
    assert value(m, "kvserve_time_to_first_token_seconds_count", model="b") == 1
    # One token per output: 4 gaps per sequence of 5 tokens, 4 sequences on "a".
    assert value(m, "kvserve_inter_token_latency_seconds_count", model="a") == 16
    assert value(m, "kvserve_queue_wait_seconds_count", model="a") == 4
    assert value(m, "kvserve_prefill_seconds_count", model="a") == 4
    assert value(m, "kvserve_e2e_request_latency_seconds_count", model="a") == 3
    chat_ok = {"model": "a", "endpoint": "/v1/chat/completions", "status": "200"}
    assert value(m, "kvserve_requests_total", **chat_ok) == 3
    assert value(m, "kvserve_requests_total", model="", endpoint="/v1/chat/completions", status="404") == 1
    assert value(m, "kvserve_requests_total", model="b", endpoint="/v1/completions", status="429") == 1
    assert value(m, "kvserve_requests_rejected_total", model="b") == 1
    assert value(m, "kvserve_generated_tokens_total", model="a") == 4 * NUM_OUT
    assert value(m, "kvserve_generated_tokens_total", model="b") == len("bye") + 1
    assert value(m, "kvserve_prompt_tokens_total", model="b") == 3
    prompt_a = value(m, "kvserve_prompt_tokens_total", model="a")
    assert prompt_a == 3 * len(engines["a"].submitted[0].prompt_tokens)  # n=2 counts it once
    assert value(m, "kvserve_requests_cancelled_total", model="a") == 0
    assert value(m, "kvserve_slots_total", model="b") == 1
    assert value(m, "kvserve_slots_free", model="a") == 4


async def test_request_id_echoed_or_minted_and_one_access_line_per_request(
    two: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kvserve.access")
    r = await two.post(
        "/v1/chat/completions",
        json=chat("gpt-4o-mini"),
        headers={"X-Request-Id": "req-123", "X-Kvserve-Session": "s-1"},
    )
    assert r.headers["x-request-id"] == "req-123"
    minted = (await two.get("/v1/models")).headers["x-request-id"]
    assert len(minted) == 32 and int(minted, 16) >= 0
    odd = (await two.get("/livez", headers={"X-Request-Id": "a b"})).headers["x-request-id"]
    assert odd != "a b"
    lines = [rec for rec in caplog.records if rec.name == "kvserve.access"]
    assert len(lines) == 3
    first = lines[0].access  # type: ignore[attr-defined]
    assert first["request_id"] == "req-123" and first["model"] == "a"
    assert first["endpoint"] == "/v1/chat/completions" and first["status"] == 200
    assert first["session"] == "s-1" and first["generated_tokens"] == NUM_OUT
    assert first["prompt_tokens"] > 0 and first["ttft_s"] is not None
    assert "request_id=req-123" in lines[0].getMessage()
    assert lines[1].access["prompt_tokens"] is None  # type: ignore[attr-defined]
    line = json.loads(JsonFormatter().format(lines[0]))
    assert line["request_id"] == "req-123" and line["logger"] == "kvserve.access"
    assert line["level"] == "info" and "duration_s" in line


async def test_drain_refuses_new_work_and_cancels_what_outlives_the_grace() -> None:
    slow = FakeEngine(reply="word " * 100, delay=0.02, model_id="a")
    app = create_app(Settings(models=(ModelSection(id="a"),)), engines={"a": slow})
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        stream = asyncio.ensure_future(
            client.post("/v1/chat/completions", json=chat("a", stream=True))
        )
        while not slow.running:
            await asyncio.sleep(0.01)
        drain = asyncio.ensure_future(app.state.lifecycle.drain(0.2))
        await asyncio.sleep(0.05)
        refused = await client.post("/v1/chat/completions", json=chat("a"))
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "shutting_down"
        health = await client.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "draining"
        await asyncio.wait_for(drain, 10)
        r = await stream
        assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
        assert 0 < r.text.count('"content": "w"') < 100  # cut, but ended properly
        assert slow.aborted
        m = samples((await client.get("/metrics")).text)
        assert value(m, "kvserve_requests_cancelled_total", model="a") == 1
        assert value(m, "kvserve_requests_total", model="", endpoint="other", status="503") == 1


async def test_drain_lets_requests_within_the_grace_finish() -> None:
    quick = FakeEngine(reply="word " * 10, delay=0.01, model_id="a")
    app = create_app(Settings(models=(ModelSection(id="a"),)), engines={"a": quick})
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        pending = asyncio.ensure_future(client.post("/v1/chat/completions", json=chat("a")))
        while not quick.running:
            await asyncio.sleep(0.01)
        await asyncio.wait_for(app.state.lifecycle.drain(30), 10)
        r = await pending
        assert r.json()["choices"][0]["finish_reason"] == "stop"
        assert r.json()["choices"][0]["message"]["content"] == "word " * 10
        assert not quick.aborted


async def test_metrics_can_be_switched_off() -> None:
    from server.config.tree import MetricsSection

    app = create_app(Settings(metrics=MetricsSection(enabled=False)), engine=FakeEngine())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        assert (await client.get("/metrics")).status_code == 404
        assert (await client.post("/v1/chat/completions", json=chat("fake-model"))).status_code == 200
