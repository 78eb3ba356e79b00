"""MCP tool calls in the request's trace (fake engine, real OTLP receiver, real MCP
servers): an `mcp.round` span per loop round and an `mcp.call` span per tool call under
the request's server span, and the call's W3C `traceparent` reaching the MCP server (the
HTTP header on streamable HTTP and SSE, `_meta` on every transport), per call even on
a shared connection."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from server.config.tree import TracingSection
from server.telemetry import tracing
from tests.fakes import FakeEngine
from tests.helpers.mcp.servers import HttpMcp, http_mcp
from tests.helpers.mcp_app import call, mcp_client, servers
from tests.otlp_receiver import Receiver, Span, running_receiver
from tests.server.api.test_openai_api import MODEL

TRACE_A = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACE_B = "0af7651916cd43dd8448eb211c80319c"


def traceparent(trace_id: str) -> str:
    return f"00-{trace_id}-00f067aa0ba902b7-01"


@pytest.fixture(scope="module")
def mcp_http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpMcp]:
    with http_mcp(tmp_path_factory.mktemp("mcp")) as server:
        yield server


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as r:
        yield r


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine(n_ctx=16384)


@pytest.fixture
async def client(fake: FakeEngine, mcp_http: HttpMcp, tmp_path: Path, receiver: Receiver
                 ) -> AsyncIterator[httpx.AsyncClient]:  # fmt: skip
    section = TracingSection(otlp_endpoint=receiver.url, service_name="kvserve-test")
    with tracing.started(section):
        async with mcp_client(fake, servers(mcp_http.url, tmp_path / "stdio.log"),
                              tracing=section, max_tool_iterations=3) as c:  # fmt: skip
            yield c


def req(label: str = "tools", **extra: Any) -> dict[str, Any]:
    tools = [{"type": "mcp", "server_label": label, "require_approval": "never"}]
    return {"model": MODEL, "input": "trace it", "tools": tools, **extra}


def force(name: str, label: str = "tools") -> dict[str, Any]:
    return {"type": "mcp", "server_label": label, "name": name}


def seen(body: dict[str, Any]) -> dict[str, Any]:
    """What the `trace` tool saw: {"header": ..., "meta": ...}."""
    (called,) = [i for i in body["output"] if i["type"] == "mcp_call" and i["name"] == "trace"]
    got: dict[str, Any] = json.loads(called["output"])
    return got


async def test_rounds_and_calls_are_spans_of_the_request(
    client: httpx.AsyncClient, fake: FakeEngine, receiver: Receiver
) -> None:
    fake.replies = [call("trace"), call("boom"), "Done."]
    r = await client.post("/v1/responses", json=req(tool_choice="required"),
                          headers={"traceparent": traceparent(TRACE_A)})  # fmt: skip
    assert r.status_code == 200, r.text
    assert [i["type"] for i in r.json()["output"]] == [
        "mcp_list_tools", "mcp_call", "mcp_call", "message"]  # fmt: skip
    got = seen(r.json())
    tracing.shutdown()  # flush
    spans = receiver.wait_for(8)
    (server,) = [s for s in spans if s.kind == "server"]
    assert server.trace_id == TRACE_A
    rounds = sorted(receiver.named("mcp.round"), key=lambda s: s.start_ns)
    assert [s.attributes["kvserve.mcp.round"] for s in rounds] == [1, 2, 3]
    assert all(s.parent_id == server.span_id and s.trace_id == TRACE_A for s in rounds)
    assert [s.attributes["kvserve.mcp.calls"] for s in rounds] == [1, 1, 0]
    assert rounds[2].attributes["kvserve.finish_reason"] == "stop"
    assert all(s.attributes["kvserve.tokens.prompt"] > 0 for s in rounds)
    assert server.start_ns <= rounds[0].start_ns and rounds[-1].end_ns <= server.end_ns
    calls = {s.attributes["gen_ai.tool.name"]: s for s in receiver.named("mcp.call")}
    traced, boom = calls["trace"], calls["boom"]
    assert traced.parent_id == rounds[0].span_id and boom.parent_id == rounds[1].span_id
    assert rounds[0].start_ns <= traced.start_ns and traced.end_ns <= rounds[0].end_ns
    assert traced.attributes["kvserve.mcp.server"] == "tools"
    assert traced.attributes["mcp.method.name"] == "tools/call"
    assert traced.attributes["kvserve.mcp.outcome"] == "completed" and traced.status != 2
    # measured on the monotonic clock, the span on the wall clock: close, not equal
    assert traced.attributes["kvserve.mcp.duration_s"] == pytest.approx(traced.duration_s, abs=0.01)
    assert boom.attributes["kvserve.mcp.outcome"] == "failed"
    assert boom.status == 2 and boom.attributes["error.type"] == "tool_error"
    # the MCP server got the call's own span as parent, as header and in _meta
    expected = f"00-{TRACE_A}-{traced.span_id}-01"
    assert got == {"header": expected, "meta": expected}


async def test_a_shared_connection_carries_each_callers_traceparent(
    client: httpx.AsyncClient, fake: FakeEngine, receiver: Receiver
) -> None:
    got = []
    for trace_id in (TRACE_A, TRACE_B):  # the second request reuses the first's connection
        fake.replies = [call("trace"), "ok"]
        r = await client.post("/v1/responses", json=req(tool_choice=force("trace")),
                              headers={"traceparent": traceparent(trace_id)})  # fmt: skip
        assert r.status_code == 200, r.text
        got.append(seen(r.json()))
    tracing.shutdown()
    calls = {s.trace_id: s for s in receiver.named("mcp.call")}
    for trace_id, saw in zip((TRACE_A, TRACE_B), got, strict=True):
        expected = f"00-{trace_id}-{calls[trace_id].span_id}-01"
        assert saw == {"header": expected, "meta": expected}


async def test_stdio_gets_the_traceparent_in_meta(
    client: httpx.AsyncClient, fake: FakeEngine, receiver: Receiver
) -> None:
    fake.replies = [call("trace"), "ok"]
    r = await client.post("/v1/responses", json=req("local", tool_choice=force("trace", "local")),
                          headers={"traceparent": traceparent(TRACE_B)})  # fmt: skip
    assert r.status_code == 200, r.text
    got = seen(r.json())
    tracing.shutdown()
    (span,) = [s for s in receiver.wait_for(3) if s.name == "mcp.call"]
    assert span.attributes["kvserve.mcp.server"] == "local"
    assert got == {"header": None, "meta": f"00-{TRACE_B}-{span.span_id}-01"}


async def test_sse_gets_the_traceparent_header(
    fake: FakeEngine, tmp_path: Path, receiver: Receiver
) -> None:
    section = TracingSection(otlp_endpoint=receiver.url, service_name="kvserve-test")
    entries = [{"label": "tools", "url": "", "transport": "sse"}]
    with http_mcp(tmp_path, "sse") as sse, tracing.started(section):
        entries[0]["url"] = sse.url
        async with mcp_client(fake, entries, tracing=section) as client:
            fake.replies = [call("trace"), "ok"]
            r = await client.post("/v1/responses", json=req(tool_choice=force("trace")),
                                  headers={"traceparent": traceparent(TRACE_A)})  # fmt: skip
            assert r.status_code == 200, r.text
            got = seen(r.json())
        tracing.shutdown()
        spans: list[Span] = [s for s in receiver.wait_for(3) if s.name == "mcp.call"]
    expected = f"00-{TRACE_A}-{spans[0].span_id}-01"
    assert got == {"header": expected, "meta": expected}


async def test_tracing_off_sends_no_traceparent(
    fake: FakeEngine, mcp_http: HttpMcp, tmp_path: Path
) -> None:
    async with mcp_client(fake, servers(mcp_http.url, tmp_path / "s.log")) as client:
        fake.replies = [call("trace"), "ok"]
        r = await client.post("/v1/responses", json=req(tool_choice=force("trace")),
                              headers={"traceparent": traceparent(TRACE_A)})  # fmt: skip
        assert r.status_code == 200, r.text
        assert seen(r.json()) == {"header": None, "meta": None}
