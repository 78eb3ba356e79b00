"""A restarted server process is warm: the prefix cache's disk tier outlives it, and the
warm answer is the cold answer."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.helpers.exact import reused
from tests.kvserve_process import MODEL, metrics, running

pytestmark = pytest.mark.model

SYSTEM = " ".join(f"Rule {i}: parcels for zone {i % 9} leave at {i % 12 + 1} o'clock." for i in range(30))


def ask(url: str, question: str) -> tuple[str, int, int]:
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "max_tokens": 16,
        "temperature": 0,
    }
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).json()
    usage = reply["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    return reply["choices"][0]["message"]["content"], usage["prompt_tokens"], cached


def test_a_restarted_server_is_warm_and_answers_as_cold(tmp_path: Path) -> None:
    config = tmp_path / "kvserve.toml"
    config.write_text(
        f'[engine]\nn_ctx = 1024\nn_seq_max = 2\nembeddings = false\nexact_reuse = true\n'
        f'[cache]\ndisk_dir = "{tmp_path / "cache"}"\n'
    )
    args = ["--config", str(config)]
    with running(args, tmp_path) as server:
        cold, prompt_tokens, cached = ask(server.url, "When do parcels for zone 4 leave?")
        assert cached == 0 and prompt_tokens > 200
    # SIGTERM: the engine saved what it held and the writer drained before exit.
    assert server.process.returncode == 0
    assert any((tmp_path / "cache").rglob("*")), "nothing was written to the disk tier"
    with running(args, tmp_path) as server:
        warm, _, cached = ask(server.url, "When do parcels for zone 4 leave?")
        assert warm == cold
        assert cached == reused(prompt_tokens)  # the last 64+ are computed again, as cold
        cache = httpx.get(f"{server.url}/v1/cache").json()["data"][0]
        assert cache["disk"]["hits"] == 1 and cache["requests"] == {"exact": 1}
        assert metrics(server.url)["kvserve_cache_tokens_reused_total"] == cached


def test_a_restart_on_the_defaults_is_warm_from_the_users_cache_directory(tmp_path: Path) -> None:
    """No cache configuration at all: the disk tier is on, under ~/.cache/kvserve (HOME is
    a temporary directory here), and the start-up log says where and how big."""
    env = {"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": ""}
    args = ["--n-ctx", "1024", "--parallel", "2"]
    where = tmp_path / "home" / ".cache" / "kvserve"
    with running(args, tmp_path, env=env) as server:
        cold, prompt_tokens, cached = ask(server.url, "When do parcels for zone 7 leave?")
        assert cached == 0
    assert server.process.returncode == 0
    assert f"cache: disk tier at {where}/" in server.log()
    assert "budget 8.0 GiB" in server.log()
    assert list(where.rglob("*.kv")), "nothing was written to the default disk tier"
    with running(args, tmp_path, env=env) as server:
        warm, _, cached = ask(server.url, "When do parcels for zone 7 leave?")
        # Whole 64-token blocks of the prompt come back from the disk tier (exact reuse
        # is off by default, so the reply may differ from the cold one in a few tokens).
        assert warm and prompt_tokens - 64 <= cached < prompt_tokens
        assert httpx.get(f"{server.url}/v1/cache").json()["data"][0]["disk"]["hits"] == 1
