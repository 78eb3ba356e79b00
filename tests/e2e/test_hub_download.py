"""`kvserve --hf-repo` against a hub stand-in on loopback (HF_ENDPOINT): download at start,
a cache hit on the second start, the cache when the hub is out of reach, offline mode with
the cache, exit 2 when it cannot."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from server.config.tree import default_model_path
from tests.helpers.hub_standin import HubFile, StandIn, serving
from tests.kvserve_process import free_port, running

pytestmark = pytest.mark.model

REPO = "kvtest/SmolLM2-135M-Instruct-GGUF"


@pytest.fixture
def hub() -> Iterator[StandIn]:
    files = {"SmolLM2-135M-Instruct.Q4_1.gguf": HubFile(Path(default_model_path()))}
    with serving(StandIn({REPO: files})) as stand_in:
        yield stand_in


def _env(hub: StandIn, cache: Path, offline: bool = False) -> dict[str, str]:
    return {
        "HF_ENDPOINT": hub.url,
        "HF_HUB_CACHE": str(cache),
        "HF_HUB_OFFLINE": "1" if offline else "0",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }


def _answer(url: str) -> str:
    body = {"model": REPO, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["text"])


def test_download_cache_hit_offline(hub: StandIn, tmp_path: Path) -> None:
    args = ["--hf-repo", REPO + ":Q4_1", "--parallel", "1", "--threads", "2"]
    with running(args, tmp_path, env=_env(hub, tmp_path / "hf")) as server:
        first = _answer(server.url)
        assert httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"] == REPO
    assert hub.downloads == ["SmolLM2-135M-Instruct.Q4_1.gguf"]
    with running(args, tmp_path, env=_env(hub, tmp_path / "hf")) as server:
        assert _answer(server.url) == first
    assert len(hub.downloads) == 1  # the second start found it in the cache
    # The hub out of reach (nothing listens there), not offline: the cached file, a warning.
    down = {**_env(hub, tmp_path / "hf"), "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"}
    with running(args, tmp_path, env=down) as server:
        assert _answer(server.url) == first
        assert "the hub cannot be reached" in server.log()
    hub.repos.clear()
    with running(args, tmp_path, env=_env(hub, tmp_path / "hf", offline=True)) as server:
        assert _answer(server.url) == first


def test_missing_repo_exits_2(hub: StandIn, tmp_path: Path) -> None:
    env = _env(hub, tmp_path / "hf")
    proc = subprocess.run(
        [sys.executable, "-m", "server", "--port", str(free_port()), "--hf-repo", "kvtest/nope:Q4_1"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert proc.returncode == 2, proc.stderr
    assert "kvserve: model.hf_repo: repository kvtest/nope not found" in proc.stderr
