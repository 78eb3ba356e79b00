"""Operations on the real process: two models, metrics, logs, a real Prometheus scrape."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.kvserve_process import Server, free_port, running, terminate

pytestmark = pytest.mark.model

CONFIG = """
[engine]
n_ctx = 512
n_seq_max = 2
embeddings = false
[[models]]
id = "smol-a"
aliases = ["gpt-4o-mini"]
[[models]]
id = "smol-b"
n_seq_max = 1
[logging]
json = true
llama_level = "info"
"""
HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("ops")
    config = tmp / "kvserve.toml"
    config.write_text(CONFIG)
    with running(["--config", str(config)], tmp) as server:
        yield server


@pytest.fixture
def client(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as client:
        yield client


def metric_values(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = httpx.get(f"{url}/metrics").text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def get(values: dict, name: str, **labels: str) -> float:
    return values.get((name, frozenset(labels.items())), 0.0)


def test_two_models_in_one_process(client: openai.OpenAI, server: Server) -> None:
    assert [m.id for m in client.models.list().data] == ["smol-a", "smol-b"]
    by_alias = client.chat.completions.create(
        model="gpt-4o-mini", messages=HELLO, max_tokens=4, temperature=0  # type: ignore[arg-type]
    )
    other = client.chat.completions.create(
        model="smol-b", messages=HELLO, max_tokens=4, temperature=0  # type: ignore[arg-type]
    )
    assert (by_alias.model, other.model) == ("smol-a", "smol-b")
    # The same GGUF under two ids: two engines, the same greedy answer.
    assert by_alias.choices[0].message.content == other.choices[0].message.content
    values = metric_values(server.url)
    assert get(values, "kvserve_slots_total", model="smol-a") == 2
    assert get(values, "kvserve_slots_total", model="smol-b") == 1
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="smol-c", messages=HELLO)  # type: ignore[arg-type]
    health = httpx.get(f"{server.url}/health").json()
    assert health["models"] == {"smol-a": {"status": "ready"}, "smol-b": {"status": "ready"}}


def test_metrics_move_with_real_traffic(server: Server) -> None:
    before = metric_values(server.url)
    body = {"model": "smol-a", "messages": HELLO, "max_tokens": 8, "ignore_eos": True}
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        json=body,
        headers={"X-Request-Id": "e2e-metrics-1"},
        timeout=60,
    )
    assert r.status_code == 200 and r.headers["x-request-id"] == "e2e-metrics-1"
    usage = r.json()["usage"]
    after = metric_values(server.url)

    def delta(name: str, **labels: str) -> float:
        return get(after, name, **labels) - get(before, name, **labels)

    a = {"model": "smol-a"}
    assert delta("kvserve_time_to_first_token_seconds_count", **a) == 1
    assert delta("kvserve_time_to_first_token_seconds_sum", **a) > 0
    assert delta("kvserve_inter_token_latency_seconds_count", **a) == 7  # 8 tokens, 7 gaps
    assert delta("kvserve_queue_wait_seconds_count", **a) == 1
    assert delta("kvserve_prefill_seconds_count", **a) == 1
    assert delta("kvserve_prefill_seconds_sum", **a) > 0
    assert delta("kvserve_e2e_request_latency_seconds_count", **a) == 1
    assert delta("kvserve_generated_tokens_total", **a) == 8 == usage["completion_tokens"]
    assert delta("kvserve_prompt_tokens_total", **a) == usage["prompt_tokens"]
    labels = {"model": "smol-a", "endpoint": "/v1/chat/completions", "status": "200"}
    assert delta("kvserve_requests_total", **labels) == 1
    assert delta("kvserve_engine_steps_total", **a) >= 8
    assert delta("kvserve_batch_size_tokens_count", **a) >= 8
    assert delta("kvserve_sampled_tokens_total", **a) == 8
    assert get(after, "kvserve_slots_in_use", **a) == 0
    assert get(after, "kvserve_sampled_tokens_total", model="smol-b") == get(
        before, "kvserve_sampled_tokens_total", model="smol-b"
    )
    # Its access line, as JSON, with the same request id.
    lines = [json.loads(x) for x in server.log().splitlines() if x.startswith("{")]
    (line,) = [x for x in lines if x.get("request_id") == "e2e-metrics-1"]
    assert line["logger"] == "kvserve.access" and line["model"] == "smol-a"
    assert line["status"] == 200 and line["generated_tokens"] == 8
    assert line["prompt_tokens"] == usage["prompt_tokens"] and line["ttft_s"] > 0
    # llama.cpp's own lines arrive through Python logging, at the configured level.
    assert any(x["logger"] == "kvserve.llama" and x["level"] == "info" for x in lines)


PROMETHEUS_CONFIG = """
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: kvserve
    static_configs:
      - targets: ["{target}"]
"""


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus is not installed")
def test_real_prometheus_scrapes_the_ttft_histogram(
    server: Server, client: openai.OpenAI, tmp_path: Path
) -> None:
    client.chat.completions.create(model="smol-b", messages=HELLO, max_tokens=4)  # type: ignore[arg-type]
    config = tmp_path / "prometheus.yml"
    config.write_text(PROMETHEUS_CONFIG.format(target=server.url.removeprefix("http://")))
    port = free_port()
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed in the finally below
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        api = f"http://127.0.0.1:{port}/api/v1/query"
        query = 'kvserve_time_to_first_token_seconds_count{model="smol-b"}'
        deadline = time.monotonic() + 60
        result: list = []
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                result = httpx.get(api, params={"query": query}, timeout=2).json()["data"]["result"]
            except (httpx.HTTPError, KeyError, ValueError):
                result = []
            if result and float(result[0]["value"][1]) > 0:
                break
            time.sleep(0.5)
        assert result, "Prometheus never scraped the TTFT histogram"
        assert result[0]["metric"]["job"] == "kvserve" and float(result[0]["value"][1]) >= 1
        buckets = httpx.get(
            api, params={"query": 'kvserve_time_to_first_token_seconds_bucket{model="smol-b"}'}
        ).json()["data"]["result"]
        assert {b["metric"]["le"] for b in buckets} >= {"0.1", "1.0", "+Inf"}
        inf = next(b for b in buckets if b["metric"]["le"] == "+Inf")
        assert float(inf["value"][1]) >= 1
    finally:
        terminate(proc, 15)
        log.close()
