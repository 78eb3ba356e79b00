"""Issue 10's defects against the real server process: one server with three models
(the same GGUF under three configurations), each the setting of one defect."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.kvserve_process import Server, metrics, running

TEMPLATES = Path(__file__).parent.parent / "chat" / "templates"
LLAMA3 = TEMPLATES / "meta-llama-Llama-3.3-70B-Instruct.jinja"
HERMES = TEMPLATES / "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        # no "description" on the parameter: Hermes templates read it
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("healing")
    config = tmp / "kvserve.toml"
    config.write_text(f"""
[engine]
n_ctx = 512
n_seq_max = 2
n_threads = 1
embeddings = false

[[models]]
id = "llama3"
chat_template = "{LLAMA3}"

[[models]]
id = "hermes"
chat_template = "{HERMES}"
context_overflow = "drop_oldest"

[[models]]
id = "limited"
total_timeout_s = 0.3
""")
    with running(["--config", str(config), "--log-level", "warning"], tmp) as proc:
        yield proc
        assert proc.process.poll() is None
        assert "Traceback" not in proc.log(), proc.log()[-4000:]


def post(server: Server, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=600)


def test_llama3_tool_calls_at_many_seeds_do_not_kill_the_process(server: Server) -> None:
    for seed in range(6):
        body = {
            "model": "llama3",
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": [WEATHER],
            "tool_choice": "auto",
            "seed": seed,
            "max_tokens": 64,
        }
        r = post(server, body)
        assert r.status_code == 200, r.text
    assert server.process.poll() is None


def test_a_tool_parameter_without_description_renders(server: Server) -> None:
    body = {
        "model": "hermes",
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": [WEATHER],
        "max_tokens": 8,
        "temperature": 0,
    }
    r = post(server, body)
    assert r.status_code == 200, r.text


def test_integers_beyond_int32_are_400_naming_the_field(server: Server) -> None:
    body = {"model": "hermes", "messages": [{"role": "user", "content": "Hi"}], "top_k": 10**32}
    r = post(server, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "top_k"


def test_a_time_limit_is_504_and_frees_the_slot(server: Server) -> None:
    body = {
        "model": "limited",
        "messages": [{"role": "user", "content": "Count to one thousand."}],
        "max_tokens": 400,
        "ignore_eos": True,
    }
    r = post(server, body)
    assert r.status_code == 504, r.text
    assert r.json()["error"]["code"] in ("total_timeout", "prefill_timeout")
    r = post(server, {**body, "stream": True})
    assert '"code": "total_timeout"' in r.text or '"code":"total_timeout"' in r.text, r.text
    counted = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert 'kvserve_request_timeouts_total{model="limited"} 2.0' in counted, counted
    assert metrics  # (parsed helper kept for the single-model servers)
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


def test_context_overflow_drops_the_oldest_turns_when_configured(server: Server) -> None:
    history = []
    for i in range(12):
        history += [
            {"role": "user", "content": f"Tell me fact number {i} about the sea, at length."},
            {"role": "assistant", "content": "The sea is wide and deep. " * 8},
        ]
    messages = [{"role": "system", "content": "Be brief."}, *history,
                {"role": "user", "content": "Thanks!"}]  # fmt: skip
    body = {"messages": messages, "max_tokens": 4, "temperature": 0}
    refused = post(server, {**body, "model": "llama3"})
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "context_length_exceeded"
    fitted = post(server, {**body, "model": "hermes"})
    assert fitted.status_code == 200, fitted.text
    assert int(fitted.headers["X-Kvserve-Dropped-Messages"]) >= 2
    assert fitted.json()["usage"]["prompt_tokens"] + 4 <= 512
