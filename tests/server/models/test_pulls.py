"""Pulls take no thread generation needs, at most `max_concurrent_pulls` at once, and
no byte of a file that does not fit (issue 28, item 8). A hub stand-in on loopback whose
downloads stay in flight until the test lets them go; the fake engine."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import namedtuple
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from huggingface_hub import constants

import server.models.pulls as pulls_module
from server.app import create_app
from server.config.tree import ConfigError, HubSection, ModelSection, Settings, load_settings
from tests.fakes import FakeEngine
from tests.helpers.hub_standin import HubFile, StandIn, fake_gguf, serving
from tests.helpers.waiting import until

REPO = "kvtest/tiny-GGUF"
QUANTS = ("Q4_0", "Q4_1", "Q5_0", "Q8_0")
LIMIT = 3


@pytest.fixture
def ggufs(tmp_path: Path) -> dict[str, Path]:
    """One file per quant: the same bytes would share one blob, and its download lock."""
    made = {}
    for quant in QUANTS:
        (tmp_path / quant).mkdir()
        made[quant] = fake_gguf(tmp_path / quant)
    return made


@pytest.fixture
def gguf(ggufs: dict[str, Path]) -> Path:
    return ggufs[QUANTS[0]]


@pytest.fixture
def hub(ggufs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> Iterator[StandIn]:
    files = {f"tiny-{q}.gguf": HubFile(path) for q, path in ggufs.items()}
    hub = StandIn({REPO: files}, hold=threading.Event())
    with serving(hub) as stand_in:
        monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 60)  # held, not stalled
        monkeypatch.setattr(constants, "ENDPOINT", stand_in.url)
        template = stand_in.url + "/{repo_id}/resolve/{revision}/{filename}"
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        try:
            yield stand_in
        finally:
            assert hub.hold is not None
            hub.hold.set()  # a failed test must not leave downloads waiting


def _client(tmp_path: Path, **hub: Any) -> httpx.AsyncClient:
    settings = Settings(
        models=(ModelSection(id="fake-model"),),
        hub=HubSection(cache_dir=str(tmp_path / "hf"), **hub),
    )
    app = create_app(settings, FakeEngine(n_ctx=40_000))
    transport = httpx.ASGITransport(app=app)
    return httpx.AsyncClient(transport=transport, base_url="http://t", timeout=60)


@pytest.fixture
async def small_default_pool() -> AsyncIterator[None]:
    """asyncio's default pool as it is on a 2-core machine, near enough: as many
    threads as the pulls may take (6 there)."""
    pool = ThreadPoolExecutor(LIMIT)
    asyncio.get_running_loop().set_default_executor(pool)
    yield
    pool.shutdown(wait=False)


def _pull(c: httpx.AsyncClient, quant: str, stream: bool = False) -> Any:
    return c.post("/api/pull", json={"model": f"hf.co/{REPO}:{quant}", "stream": stream})


async def test_pulls_in_flight_leave_generation_alone_and_one_more_is_refused(
    tmp_path: Path, hub: StandIn, small_default_pool: None
) -> None:
    async with _client(tmp_path, max_concurrent_pulls=LIMIT) as c:
        pulls = [asyncio.create_task(_pull(c, q)) for q in QUANTS[:LIMIT]]
        await until(lambda: len(hub.downloads) == LIMIT, 10.0)  # every one is downloading
        # A prompt long enough to be tokenized off the event loop (asyncio's pool).
        long = {"role": "user", "content": "word " * 5000}
        body = {"model": "fake-model", "messages": [long], "max_tokens": 3}
        r = await asyncio.wait_for(c.post("/v1/chat/completions", json=body), 30)
        assert r.status_code == 200, r.text
        # One more download is refused at once; a pull of a name downloading follows it.
        r = await _pull(c, QUANTS[LIMIT])
        assert r.status_code == 429 and r.headers["retry-after"] == "30", r.text
        assert f"max_concurrent_pulls = {LIMIT}" in r.json()["error"]
        same = asyncio.create_task(_pull(c, QUANTS[0]))
        assert hub.hold is not None
        hub.hold.set()
        for r in await asyncio.wait_for(asyncio.gather(*pulls, same), 60):
            assert r.status_code == 200 and r.json() == {"status": "success"}, r.text
        assert sorted(hub.downloads) == sorted(f"tiny-{q}.gguf" for q in QUANTS[:LIMIT])
        r = await _pull(c, QUANTS[LIMIT])  # a thread is free again
        assert r.status_code == 200, r.text


def _blobs(tmp_path: Path) -> list[str]:
    return [p.name for p in (tmp_path / "hf").rglob("*") if p.is_file()]


async def test_a_pull_over_the_budget_is_refused_before_its_first_byte(
    tmp_path: Path, hub: StandIn, gguf: Path
) -> None:
    size = gguf.stat().st_size
    assert hub.hold is not None
    hub.hold.set()
    async with _client(tmp_path, max_cache_bytes=size + size // 2) as c:
        r = await _pull(c, "Q4_0")  # fits
        assert r.status_code == 200, r.text
        r = await _pull(c, "Q8_0")  # the cache holds one already: two do not fit
        assert r.status_code == 507, r.text
        error = r.json()["error"]
        assert f"tiny-Q8_0.gguf is 293.0 KiB ({size} bytes)" in error
        assert "max_cache_bytes, is 439.5 KiB" in error
        assert hub.downloads == ["tiny-Q4_0.gguf"]  # nothing of Q8_0 was asked for
        assert not any("incomplete" in n for n in _blobs(tmp_path))
        r = await _pull(c, "Q8_0", stream=True)  # a stream says so in its last line
        assert r.status_code == 200
        lines = [json.loads(x) for x in r.text.splitlines()]
        assert "max_cache_bytes" in lines[-1]["error"]
        tags = [m["name"] for m in (await c.get("/api/tags")).json()["models"]]
        assert f"hf.co/{REPO}:Q8_0" not in tags


async def test_a_pull_larger_than_the_free_space_or_beside_one_in_flight_is_refused(
    tmp_path: Path, hub: StandIn, gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    size = gguf.stat().st_size
    usage = namedtuple("usage", "total used free")
    free = {"bytes": size - 1}
    monkeypatch.setattr(pulls_module.shutil, "disk_usage", lambda _: usage(0, 0, free["bytes"]))
    async with _client(tmp_path) as c:
        r = await _pull(c, "Q4_0")
        assert r.status_code == 507, r.text
        assert "293.0 KiB free" in r.json()["error"] and hub.downloads == []
        free["bytes"] = size + size // 2  # one fits, not two at once
        first = asyncio.create_task(_pull(c, "Q4_0"))
        await until(lambda: hub.downloads == ["tiny-Q4_0.gguf"], 10.0)
        r = await _pull(c, "Q8_0")
        assert r.status_code == 507 and "pulls under way will write" in r.json()["error"]
        assert hub.hold is not None
        hub.hold.set()
        assert (await first).status_code == 200
        assert hub.downloads == ["tiny-Q4_0.gguf"]


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("MAX_CONCURRENT_PULLS", "0", "hub.max_concurrent_pulls: must be at least 1"),
        ("MAX_CACHE_BYTES", "-1", "hub.max_cache_bytes: must not be negative"),
    ],
)
def test_bad_pull_settings(key: str, value: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        load_settings(env={f"KVSERVE_HUB_{key}": value})
