"""Scale-out for real: two kvserve replicas behind Debian's nginx (the README's affinity
config), sharing one redis-server as the cache's shared tier.

- A prompt computed on replica 1 is answered warm by replica 2, with the cold answer.
- Redis stopped mid-run: requests still succeed (cold), errors are counted, nothing
  hangs; Redis back: hits resume.
- Failover: a session's replica is SIGKILLed; nginx passes the next turn to the other
  replica, which finds the conversation in Redis and answers as a cold run would.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.test_nginx_affinity import NGINX, start_nginx
from tests.helpers.exact import reused
from tests.helpers.redis_process import Redis, running_redis
from tests.kvserve_process import MODEL, Server, metrics, running, wait_ready

pytestmark = pytest.mark.model

GENERATED = "kvserve_generated_tokens_total"
DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "dashboards" / "kvserve.json"
RETRY_S = 1.0  # cache.shared_retry_s of the replicas


def manual(topic: str, n: int = 60) -> str:
    """A long system prompt (about 15 tokens a rule): long enough that the 64 tokens
    exact reuse computes again are under 10% of it."""
    return " ".join(f"{topic} rule {i}: parcels for zone {i % 9} leave at {i % 12 + 1}." for i in range(n))


@dataclass
class Cluster:
    url: str  # nginx
    replicas: list[Server]
    redis: Redis
    log_dir: Path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if NGINX is None:
        pytest.skip("nginx is not installed (apt-get install nginx; .ci/run does it)")
    tmp = tmp_path_factory.mktemp("scale-out")
    with ExitStack() as stack:
        redis = stack.enter_context(running_redis(tmp))
        config = tmp / "kvserve.toml"
        config.write_text(
            "[engine]\nn_ctx = 2048\nn_seq_max = 2\nembeddings = false\nn_threads = 1\n"
            "exact_reuse = true\n"  # so a warm reply must equal the cold one, token for token
            f'[cache]\nshared_url = "{redis.url}"\nshared_retry_s = {RETRY_S}\n'
        )
        replicas = [
            stack.enter_context(running(["--config", str(config)], tmp, wait=False))
            for _ in range(2)
        ]
        for replica in replicas:
            wait_ready(replica)
        url = start_nginx(tmp, [r.url for r in replicas], stack)
        yield Cluster(url, replicas, redis, tmp)


def chat(
    url: str, messages: list[dict[str, str]], session: str | None = None, salt: str | None = None
) -> tuple[str, int, int, float]:
    """(reply, prompt tokens, cached tokens, seconds)."""
    body: dict = {"model": MODEL, "messages": messages, "max_tokens": 12, "temperature": 0}
    if salt is not None:
        body["cache_salt"] = salt
    headers = {"X-Kvserve-Session": session} if session else {}
    start = time.monotonic()
    r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=120)
    took = time.monotonic() - start
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    text = r.json()["choices"][0]["message"]["content"]
    return text, usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"], took


def shared(server: Server) -> dict:
    return httpx.get(f"{server.url}/v1/cache", timeout=10).json()["data"][0]["shared"]


def wait_shared_write(server: Server, before: int, timeout: float = 30) -> None:
    """Until the replica's shared-tier saves (asynchronous) have written past `before`."""
    deadline = time.monotonic() + timeout
    while shared(server)["bytes_written"] <= before:
        assert time.monotonic() < deadline, "the save never reached the shared tier"
        time.sleep(0.05)


def ask(topic: str, question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": manual(topic)}, {"role": "user", "content": question}]


def test_a_prompt_computed_on_one_replica_is_warm_on_the_other(cluster: Cluster) -> None:
    one, two = cluster.replicas
    messages = ask("Depot", "When do parcels for zone 4 leave?")
    written = shared(one)["bytes_written"]
    cold, prompt_tokens, cached, cold_s = chat(one.url, messages)
    assert cached < 64 and prompt_tokens > 700
    wait_shared_write(one, written)
    warm, _, cached, warm_s = chat(two.url, messages)
    assert warm == cold
    assert cached >= 0.9 * prompt_tokens, (cached, prompt_tokens)
    stats = shared(two)
    assert stats["hits"] == 1 and stats["errors"] == 0
    assert stats["bytes_read"] > 10_000_000  # about 23 KB a token
    m = metrics(two.url)
    assert m["kvserve_cache_tokens_reused_total"] == cached
    print(f"\nscale-out: {prompt_tokens} tokens, cold {cold_s:.2f}s on replica 1, "
          f"warm {warm_s:.2f}s on replica 2 ({cached} cached)")


def test_redis_stopped_mid_run_costs_warmth_not_requests(cluster: Cluster) -> None:
    one, two = cluster.replicas
    cluster.redis.stop()
    try:
        errors = shared(two)["errors"]
        messages = ask("Harbour", "When do parcels for zone 2 leave?")
        cold, prompt_tokens, cached, _ = chat(one.url, messages)
        assert cached < 64  # at most the chat template's head, still in a slot
        start = time.monotonic()
        again, _, cached, _ = chat(two.url, messages)  # would be warm with Redis up
        assert again == cold and cached < 64
        assert time.monotonic() - start < 60  # nothing hangs on the dead store
        for i in range(3):  # through nginx too
            chat(cluster.url, ask("Harbour", f"Zone {i}?"))
        assert shared(two)["errors"] > errors
        assert shared(one)["errors"] >= 1
    finally:
        cluster.redis.start()  # an empty store on the same port
    time.sleep(RETRY_S + 0.2)
    messages = ask("Airport", "When do parcels for zone 5 leave?")
    written = shared(one)["bytes_written"]
    cold, prompt_tokens, cached, _ = chat(one.url, messages)
    assert cached < 64
    wait_shared_write(one, written)
    hits = shared(two)["hits"]
    warm, _, cached, _ = chat(two.url, messages)
    assert warm == cold and cached >= 0.9 * prompt_tokens
    assert shared(two)["hits"] == hits + 1


def exposed_names(url: str) -> set[str]:
    """Every sample name /metrics offers, including those of families that have no
    sample yet (a labelled counter that never counted still has its # TYPE line)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names |= {sample.name for sample in family.samples}
        names |= {family.name + s for s in suffixes.get(family.type, ("",))}
    return names


def test_the_dashboard_names_only_metrics_the_replicas_expose(cluster: Cluster) -> None:
    """Every PromQL expression of deploy/'s Grafana dashboard, against /metrics after the
    traffic above (warm, cold, shared hits, Redis errors)."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(exprs) >= 10
    used: set[str] = set()
    for expr in exprs:
        names = set(re.findall(r"\b(kvserve_[a-z0-9_]+)", expr))
        assert names, f"no kvserve metric in {expr!r}"
        used |= names
    for replica in cluster.replicas:
        missing = used - exposed_names(replica.url)
        assert not missing, missing
    text = httpx.get(f"{cluster.replicas[1].url}/metrics", timeout=10).text
    shared_hits = [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "kvserve_cache_lookups_total" and s.labels.get("tier") == "shared"
        and s.labels.get("result") == "hit"
    ]
    assert shared_hits and shared_hits[0] >= 2  # replica 2 was warm from Redis twice


def test_a_session_survives_the_sigkill_of_its_replica(cluster: Cluster) -> None:
    replicas = cluster.replicas
    session = "failover-conversation"
    messages = [{"role": "system", "content": manual("Warehouse", 45)}]
    home = None
    for turn in range(2):
        messages.append({"role": "user", "content": f"Turn {turn}: which zone leaves first?"})
        before = [metrics(r.url)[GENERATED] for r in replicas]
        written = [shared(r)["bytes_written"] for r in replicas]
        reply, prompt_tokens, _, _ = chat(cluster.url, messages, session)
        after = [metrics(r.url)[GENERATED] for r in replicas]
        moved = [i for i in range(2) if after[i] > before[i]]
        assert len(moved) == 1 and home in (None, moved[0])
        home = moved[0]
        wait_shared_write(replicas[home], written[home])  # the turn's state is in Redis
        messages.append({"role": "assistant", "content": reply})
    assert home is not None
    saved_tokens = prompt_tokens  # the last turn's prompt: saved at its finish
    victim, survivor = replicas[home], replicas[1 - home]
    os.kill(victim.process.pid, signal.SIGKILL)
    victim.process.wait(10)

    messages.append({"role": "user", "content": "Turn 2: and which zone leaves last?"})
    start = time.monotonic()
    reply, prompt_tokens, cached, took = chat(cluster.url, messages, session)
    failover_s = time.monotonic() - start
    assert shared(survivor)["hits"] >= 1
    assert cached >= reused(saved_tokens), (cached, saved_tokens)  # the conversation so far
    cold, _, cold_cached, cold_s = chat(survivor.url, messages, salt="cold-reference")
    assert cold_cached == 0 and reply == cold
    print(f"\nfailover: turn after SIGKILL answered in {failover_s:.2f}s with {cached} of "
          f"{prompt_tokens} prompt tokens from Redis; cold {cold_s:.2f}s")
