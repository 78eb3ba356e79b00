"""Tracing on the HTTP surface (fake engine, real OTLP receiver on loopback): the server
span and its parent, the access line's trace id, Redis spans of stored responses, the
helpers other code calls (`span`, `outgoing_headers`), and tracing off."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.client import CacheConfig
from server.app import create_app
from server.config.tree import Settings, TracingSection
from server.telemetry import tracing
from tests.fakes import FakeEngine
from tests.helpers.redis_process import Redis, running_redis
from tests.otlp_receiver import Receiver, Span, running_receiver
from tests.server.api.test_openai_api import MODEL, chat

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as r:
        yield r


def traced(receiver: Receiver, **extra: Any) -> Settings:
    section = TracingSection(
        otlp_endpoint=receiver.url, service_name="kvserve-test", headers=("x-token=s3cret",)
    )
    return Settings(tracing=section, **extra)


@pytest.fixture
async def client(receiver: Receiver) -> AsyncIterator[httpx.AsyncClient]:
    """An app with tracing on; leaving it sends what is buffered (tracing.shutdown)."""
    settings = traced(receiver)
    app = create_app(settings, engine=FakeEngine())
    with tracing.started(settings.tracing):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            yield c


def by_id(spans: list[Span]) -> dict[str, Span]:
    return {s.span_id: s for s in spans}


async def test_a_chat_request_is_one_trace_under_the_callers_span(
    client: httpx.AsyncClient, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kvserve.access")
    r = await client.post("/v1/chat/completions", json=chat(), headers={"traceparent": TRACEPARENT})
    assert r.status_code == 200, r.text
    tracing.shutdown()  # flush
    spans = receiver.wait_for(2)
    (server,) = [s for s in spans if s.kind == "server"]
    assert server.name == "POST /v1/chat/completions"
    assert (server.trace_id, server.parent_id) == (TRACE_ID, PARENT_ID)
    assert server.attributes["http.route"] == "/v1/chat/completions"
    assert server.attributes["http.request.method"] == "POST"
    assert server.attributes["http.response.status_code"] == 200
    assert server.attributes["kvserve.model"] == MODEL
    assert server.resource["service.name"] == "kvserve-test"
    (generate,) = receiver.named("kvserve.generate")
    assert generate.parent_id == server.span_id and generate.trace_id == TRACE_ID
    usage = r.json()["usage"]
    assert generate.attributes["kvserve.tokens.prompt"] == usage["prompt_tokens"]
    assert generate.attributes["kvserve.tokens.generated"] == usage["completion_tokens"]
    assert generate.attributes["kvserve.finish_reason"] == "stop"
    assert server.start_ns <= generate.start_ns and generate.end_ns <= server.end_ns
    (decode,) = receiver.named("kvserve.decode")
    assert decode.parent_id == generate.span_id
    assert decode.attributes["kvserve.tokens.generated"] == usage["completion_tokens"]
    assert receiver.posts[0]["x-token"] == "s3cret"  # [tracing] headers go with each export
    (line,) = [rec for rec in caplog.records if rec.name == "kvserve.access"]
    assert f"trace_id={TRACE_ID}" in line.getMessage()
    assert line.access["trace_id"] == TRACE_ID  # type: ignore[attr-defined]


async def test_a_stream_and_a_refusal_are_traced(
    client: httpx.AsyncClient, receiver: Receiver
) -> None:
    r = await client.post("/v1/chat/completions", json=chat(stream=True))
    assert r.status_code == 200 and "[DONE]" in r.text
    bad = await client.post("/v1/chat/completions", json=chat(temperature="hot"))
    assert bad.status_code == 400
    missing = await client.get("/v1/models/nope")
    assert missing.status_code == 404
    for probe in ("/health", "/livez", "/metrics"):  # probes and scrapes: never traced
        assert (await client.get(probe)).status_code == 200
    tracing.shutdown()
    spans = receiver.wait_for(4)
    servers = [s for s in spans if s.kind == "server"]
    assert len({s.trace_id for s in servers}) == 3  # a fresh trace each, no traceparent
    assert all(s.parent_id == "" for s in servers)
    stream = next(s for s in servers if s.attributes["http.response.status_code"] == 200)
    (generate,) = receiver.named("kvserve.generate")
    assert generate.parent_id == stream.span_id and generate.end_ns <= stream.end_ns
    refused = [s for s in servers if s is not stream]
    assert {s.attributes["http.response.status_code"] for s in refused} == {400, 404}
    assert all(s.status != 2 for s in servers)  # 4xx: the client's error, not the span's
    assert {s.attributes.get("http.route") for s in refused} == {
        "/v1/chat/completions",
        "/v1/models/{model_id:path}",  # the route template, as the access line has it
    }


async def test_n_choices_are_one_generate_span_each(
    client: httpx.AsyncClient, receiver: Receiver
) -> None:
    r = await client.post("/v1/chat/completions", json=chat(n=2))
    assert r.status_code == 200, r.text
    tracing.shutdown()
    receiver.wait_for(3)
    (server,) = [s for s in receiver.spans if s.kind == "server"]
    generates = receiver.named("kvserve.generate")
    assert sorted(g.attributes["kvserve.choice"] for g in generates) == [0, 1]
    assert all(g.parent_id == server.span_id for g in generates)
    assert sum(g.attributes["kvserve.tokens.generated"] for g in generates) == (
        r.json()["usage"]["completion_tokens"]
    )


async def test_a_caller_that_did_not_sample_gets_no_spans(
    client: httpx.AsyncClient, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kvserve.access")
    unsampled = f"00-{TRACE_ID}-{PARENT_ID}-00"
    r = await client.post("/v1/chat/completions", json=chat(), headers={"traceparent": unsampled})
    assert r.status_code == 200
    tracing.shutdown()
    assert receiver.spans == [] and receiver.posts == []
    (line,) = [rec for rec in caplog.records if rec.name == "kvserve.access"]
    assert "trace_id" not in line.getMessage()


async def test_span_and_outgoing_headers_join_the_request_trace(receiver: Receiver) -> None:
    """The helpers the MCP client (and anything else) calls: a child of the current span,
    and the traceparent to send onwards."""
    assert tracing.outgoing_headers() == {}  # off
    with tracing.span("nothing", a=1) as nothing:
        assert nothing is None
    with tracing.started(traced(receiver).tracing), tracing.span("outer", **{"kvserve.what": "outer"}):
        headers = tracing.outgoing_headers()
        with pytest.raises(RuntimeError), tracing.span("inner"):
            raise RuntimeError("boom")
    spans = by_id(receiver.wait_for(2))
    outer = next(s for s in spans.values() if s.name == "outer")
    inner = next(s for s in spans.values() if s.name == "inner")
    version, trace_id, parent_id, flags = headers["traceparent"].split("-")
    assert (version, trace_id, parent_id) == ("00", outer.trace_id, outer.span_id)
    assert int(flags, 16) & 1  # sampled
    assert inner.parent_id == outer.span_id and inner.status == 2  # failed
    assert outer.attributes == {"kvserve.what": "outer"}


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[Redis]:
    with running_redis(tmp_path) as server:
        yield server


async def test_stored_responses_in_redis_are_spans_of_the_request(
    receiver: Receiver, redis_server: Redis
) -> None:
    settings = traced(receiver, cache=CacheConfig(disk_dir="", shared_url=redis_server.url))
    app = create_app(settings, engine=FakeEngine())
    try:
        with tracing.started(settings.tracing):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                body = {"model": MODEL, "input": "Hi", "store": True}
                r = await client.post("/v1/responses", json=body)
                assert r.status_code == 200, r.text
                got = await client.get(f"/v1/responses/{r.json()['id']}")
                assert got.status_code == 200
    finally:
        app.state.responses.close()
    spans = receiver.wait_for(4)
    servers = {s.name: s for s in spans if s.kind == "server"}
    (put,) = receiver.named("redis put_response")
    (get,) = receiver.named("redis get_response")
    assert put.parent_id == servers["POST /v1/responses"].span_id
    assert get.parent_id == servers["GET /v1/responses/{response_id}"].span_id
    assert put.attributes["db.system.name"] == "redis"
    assert put.attributes["server.port"] == redis_server.port


REQUEST = """
from fastapi.testclient import TestClient
from server.app import create_app
from server.config.tree import load_settings
from tests.fakes import FakeEngine
app = create_app(load_settings(env={}), engine=FakeEngine())
with TestClient(app) as client:
    r = client.post("/v1/chat/completions", json={"model": "fake-model",
                    "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 200, r.text
"""


def run_python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
        cwd=Path(__file__).resolve().parents[3],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_tracing_off_loads_no_sdk() -> None:
    """Off (the default), a request through the whole app loads neither the SDK's tracer,
    nor an exporter, nor protobuf, nor kvserve's span code. (Others load some of it
    whatever kvserve does: FastAPI imports the OpenTelemetry API, one of its dependencies,
    and redis-py imports `opentelemetry.sdk.metrics` when the SDK is installed.)"""
    loaded = REQUEST + """
import sys
heavy = ("opentelemetry.sdk.trace", "opentelemetry.exporter", "opentelemetry.proto",
         "google.protobuf", "server.telemetry.spans")
print(sorted(m for m in sys.modules if m.startswith(heavy)))
"""
    assert run_python(loaded) == "[]"


def test_tracing_off_makes_no_spans_even_with_a_global_provider() -> None:
    """Some other code in the process (a library, an embedding app) set OpenTelemetry's
    global provider: with kvserve's tracing off, no request makes a span (FastAPI's own
    telemetry would have traced every request through it)."""
    code = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
memory = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(memory))
trace.set_tracer_provider(provider)
""" + REQUEST + """
print(len(memory.get_finished_spans()))
"""
    assert run_python(code) == "0"


def test_only_the_tracing_modules_import_opentelemetry() -> None:
    """Engine, cache and chat stay free of it; in server/, only the two tracing modules
    (and tracing.py only inside its functions, so that off loads nothing)."""
    from tests.test_layering import ROOT, imports

    for package in ("server", "engine", "chat", "cache"):
        for path in (ROOT / package).rglob("*.py"):
            name = path.relative_to(ROOT).as_posix()
            if name not in ("server/telemetry/tracing.py", "server/telemetry/spans.py"):
                assert "opentelemetry" not in imports(path), name
    top_level = {
        line.split()[1].split(".")[0]
        for line in (ROOT / "server/telemetry/tracing.py").read_text().splitlines()
        if line.startswith(("import ", "from "))
    }
    assert "opentelemetry" not in top_level
