"""Traces of the real server process on the real model, sent to a real OTLP/HTTP receiver
on loopback: one trace per request, under the caller's traceparent, with the engine's
stages (cache lookup and restore, queue, prefill, decode) where their time went, and the
calls a lookup made to the shared tier (a real redis-server)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.redis_process import running_redis
from tests.kvserve_process import MODEL, running
from tests.otlp_receiver import Receiver, Span, running_receiver

pytestmark = pytest.mark.model

ENGINE = "[engine]\nn_ctx = 1024\nn_seq_max = 1\nembeddings = false\n[cache]\ndisk_dir = \"\"\n"
RULES = " ".join(f"Rule {i}: parcels for zone {i % 9} leave at {i % 12 + 1} o'clock." for i in range(12))
OTHER = " ".join(f"Note {i}: the {i % 7}th shelf holds {i * 3} boxes of tea." for i in range(12))
STAGES = ("kvserve.cache.lookup", "kvserve.queue", "kvserve.prefill", "kvserve.decode")


def traceparent(n: int) -> tuple[str, str, str]:
    trace_id, span_id = f"{n:032x}", f"{n + 0xABC:016x}"
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def ask(url: str, system: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "When?"}],
        "max_tokens": 8,
        "temperature": 0,
    }
    r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=600)
    assert r.status_code == 200, r.text
    usage: dict[str, Any] = r.json()["usage"]
    return usage


def config(tmp_path: Path, receiver: Receiver, tracing: str, cache: str = "") -> list[str]:
    """`cache`: more [cache] settings."""
    path = tmp_path / "kvserve.toml"
    path.write_text(f'{ENGINE}{cache}[tracing]\notlp_endpoint = "{receiver.url}"\n{tracing}')
    return ["--config", str(path)]


def tree(spans: list[Span], trace_id: str) -> dict[str, Span]:
    """The spans of one trace by name (each name once per trace here: n = 1)."""
    mine = [s for s in spans if s.trace_id == trace_id]
    by_name = {s.name: s for s in mine}
    assert len(by_name) == len(mine), [s.name for s in mine]
    return by_name


def test_a_chat_request_is_one_trace_of_where_its_time_went(tmp_path: Path) -> None:
    with running_receiver() as receiver:
        tracing = 'service_name = "kvserve-e2e"\nheaders = ["x-collector-token=t0k"]\n'
        with running(config(tmp_path, receiver, tracing), tmp_path) as server:
            cold_header, cold_id, _ = traceparent(1)
            cold = ask(server.url, RULES, {"traceparent": cold_header})
            ask(server.url, OTHER)  # takes the only slot: the next RULES comes from the cache
            warm_header, warm_id, caller = traceparent(2)
            warm = ask(server.url, RULES, {"traceparent": warm_header})
        # The server stopped: its last spans were sent on the way out.
        spans = list(receiver.spans)
        log = server.log()

    assert len({s.trace_id for s in spans}) == 3  # one trace per request
    assert {s.resource["service.name"] for s in spans} == {"kvserve-e2e"}
    assert all(post["x-collector-token"] == "t0k" for post in receiver.posts)
    assert f"trace_id={warm_id}" in log and f"trace_id={cold_id}" in log

    t = tree(spans, warm_id)
    http, generate = t["POST /v1/chat/completions"], t["kvserve.generate"]
    assert http.kind == "server" and http.parent_id == caller  # under the caller's span
    assert http.attributes["http.route"] == "/v1/chat/completions"
    assert http.attributes["http.response.status_code"] == 200
    assert http.attributes["kvserve.model"] == MODEL
    assert generate.parent_id == http.span_id
    for name in (*STAGES, "kvserve.cache.restore"):
        assert t[name].parent_id == generate.span_id, name
        assert http.start_ns <= t[name].start_ns <= t[name].end_ns <= http.end_ns, name
    assert warm["prompt_tokens_details"]["cached_tokens"] > 64  # the cache served the head
    lookup, restore = t["kvserve.cache.lookup"], t["kvserve.cache.restore"]
    assert lookup.attributes["kvserve.cache.tier"] == "ram"
    assert lookup.attributes["kvserve.cache.tokens"] >= 64
    assert restore.attributes["kvserve.cache.tier"] == "ram"
    assert restore.attributes["kvserve.cache.tokens"] == warm["prompt_tokens_details"]["cached_tokens"]
    prefill, decode = t["kvserve.prefill"], t["kvserve.decode"]
    assert prefill.attributes["kvserve.tokens.reused"] == warm["prompt_tokens_details"]["cached_tokens"]
    assert (
        prefill.attributes["kvserve.tokens.computed"] + prefill.attributes["kvserve.tokens.reused"]
        == warm["prompt_tokens"]
    )
    assert decode.attributes["kvserve.tokens.generated"] == warm["completion_tokens"]
    assert decode.attributes["kvserve.tokens_per_s"] > 0
    # the stages in the order they ran
    queue = t["kvserve.queue"]
    assert lookup.end_ns <= queue.start_ns <= queue.end_ns <= restore.start_ns
    assert restore.end_ns <= prefill.start_ns <= prefill.end_ns <= decode.start_ns
    assert generate.attributes["kvserve.tokens.prompt"] == warm["prompt_tokens"]

    t = tree(spans, cold_id)  # the first: nothing to reuse, nothing restored
    assert "kvserve.cache.restore" not in t
    assert t["kvserve.cache.lookup"].attributes["kvserve.cache.tier"] == "none"
    assert t["kvserve.prefill"].attributes["kvserve.tokens.reused"] == 0
    assert t["kvserve.prefill"].attributes["kvserve.tokens.computed"] == cold["prompt_tokens"]


def test_sample_ratio_zero_traces_only_what_the_caller_sampled(tmp_path: Path) -> None:
    with running_receiver() as receiver:
        with running(config(tmp_path, receiver, "sample_ratio = 0.0\n"), tmp_path) as server:
            ask(server.url, RULES)
            header, trace_id, _ = traceparent(7)
            ask(server.url, RULES, {"traceparent": header})
        spans = list(receiver.spans)
        log = server.log()
    assert spans and {s.trace_id for s in spans} == {trace_id}
    assert log.count("trace_id=") == 1


def test_a_prefix_from_the_shared_tier_shows_the_redis_calls_of_its_lookup(
    tmp_path: Path,
) -> None:
    """Replica one computes RULES and stores it in Redis; replica two (its RAM empty, no
    disk tier) finds it there: its lookup span holds a span per Redis call it made."""
    with running_redis(tmp_path) as redis, running_receiver() as receiver:
        args = config(tmp_path, receiver, "", f'shared_url = "{redis.url}"\n')
        with running(args, tmp_path) as one:
            ask(one.url, RULES)
            ask(one.url, OTHER)  # RULES leaves the only slot: saved, then sent to Redis
            deadline = time.monotonic() + 60
            while httpx.get(f"{one.url}/v1/cache").json()["data"][0]["shared"]["bytes_written"] == 0:
                assert time.monotonic() < deadline, "nothing reached the shared tier"
                time.sleep(0.1)
        with running(args, tmp_path) as two:
            header, trace_id, _ = traceparent(3)
            warm = ask(two.url, RULES, {"traceparent": header})
        spans = list(receiver.spans)
    t = {s.name: s for s in spans if s.trace_id == trace_id}
    lookup, restore = t["kvserve.cache.lookup"], t["kvserve.cache.restore"]
    assert lookup.attributes["kvserve.cache.tier"] == "shared"
    assert restore.attributes["kvserve.cache.tier"] == "shared"
    assert restore.attributes["kvserve.cache.tokens"] == warm["prompt_tokens_details"]["cached_tokens"] > 64
    calls = sorted((s for s in spans if s.parent_id == lookup.span_id), key=lambda s: s.start_ns)
    assert [s.name for s in calls] == ["redis find", "redis get", "redis touch"]
    for call in calls:
        assert call.trace_id == trace_id
        assert lookup.start_ns <= call.start_ns <= call.end_ns <= lookup.end_ns
        assert call.attributes["db.system.name"] == "redis"
        assert call.attributes["db.operation.name"] == call.name.split()[1]
        assert (call.attributes["server.address"], call.attributes["server.port"]) == (
            "127.0.0.1", redis.port)
