"""The names of pulled models, copies and configured files (server/models/hub_models.py,
/api/copy, /api/delete): a delete removes what its name means, a copy never takes a
hub name, and what the configuration owns in the hub cache is neither listed as
pulled nor deleted. Fake engines, a hub stand-in on loopback, a real hub cache."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from huggingface_hub import hf_hub_download

from server.app import create_app
from server.config.tree import HubSection, LoraSection, ModelSection, Settings
from tests.fakes import FakeEngine
from tests.helpers.hub_standin import HubFile, StandIn, fake_gguf, point_hub_at, serving

REPO, ADAPTERS = "kvtest/tiny-GGUF", "kvtest/adapter-GGUF"
Q8, Q4 = f"hf.co/{REPO}:Q8_0", f"hf.co/{REPO}:Q4_K_M"


def _file(tmp_path: Path, name: str) -> HubFile:
    """A file of its own (two quants of one repository are never one blob)."""
    (tmp_path / name).mkdir()
    return HubFile(fake_gguf(tmp_path / name))


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[StandIn]:
    repos = {REPO: {"tiny-Q8_0.gguf": _file(tmp_path, "q8"),
                    "tiny-Q4_K_M.gguf": _file(tmp_path, "q4")},
             ADAPTERS: {"adapter.gguf": _file(tmp_path, "adapter")}}  # fmt: skip
    with serving(StandIn(repos)) as stand_in:
        point_hub_at(stand_in, monkeypatch)
        yield stand_in


def _cached(tmp_path: Path, repo: str, filename: str) -> Path:
    """A file fetched into the hub cache as a configured model's or adapter's would be."""
    return Path(hf_hub_download(repo, filename, cache_dir=str(tmp_path / "hf")))


def _app(tmp_path: Path, *models: ModelSection) -> Any:
    settings = Settings(models=models, hub=HubSection(cache_dir=str(tmp_path / "hf")))
    engines = {m.id: FakeEngine(model_id=m.id) for m in models}
    app = create_app(settings, engines=engines)
    app.state.hub_models.discover()  # what a real server does at start
    return app


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    app = _app(tmp_path, ModelSection(id="fake-model", aliases=("fm",)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        c.app = app  # type: ignore[attr-defined]
        yield c


async def _tags(c: httpx.AsyncClient) -> list[str]:
    return [m["name"] for m in (await c.get("/api/tags")).json()["models"]]


async def _delete(c: httpx.AsyncClient, name: str) -> httpx.Response:
    return await c.request("DELETE", "/api/delete", json={"model": name})


async def test_deleting_a_copy_by_another_spelling_deletes_only_the_copy(
    client: httpx.AsyncClient, hub: StandIn
) -> None:
    assert (await client.post("/api/pull", json={"model": Q8, "stream": False})).is_success
    models = client.app.state.models  # type: ignore[attr-defined]
    pulled = models.get(Q8)
    assert (await client.post("/api/copy", json={"source": Q8, "destination": "mine"})).is_success
    r = await _delete(client, "MINE")
    assert r.status_code == 200, r.text
    assert models.get("mine") is None and models.get(Q8) is pulled  # the copy went, not X
    assert Q8 in await _tags(client) and Path(pulled.path).exists()
    assert (await _delete(client, "MINE")).status_code == 404


async def test_a_name_only_case_tells_apart_is_not_guessed_at(tmp_path: Path) -> None:
    app = _app(tmp_path, ModelSection(id="Twin"), ModelSection(id="twin", aliases=("other",)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await _delete(c, "TWIN")
        assert r.status_code == 400 and "differ only in case" in r.json()["error"], r.text
        assert (
            await c.post("/api/copy", json={"source": "Twin", "destination": "mine"})
        ).is_success
        # A copy whose name differs from another model's only in case is refused.
        r = await c.post("/api/copy", json={"source": "twin", "destination": "MINE"})
        assert r.status_code == 400 and "already names the model 'Twin'" in r.json()["error"]
        assert (await _delete(c, "Mine")).status_code == 200
        assert app.state.models.get("mine") is None and len(app.state.models.models) == 2


@pytest.mark.parametrize("name", [Q8, "HF.co/kvtest/tiny-GGUF:Q8_0", "huggingface.co/a/b"])
async def test_a_copy_never_takes_a_hub_name(
    client: httpx.AsyncClient, hub: StandIn, name: str
) -> None:
    r = await client.post("/api/copy", json={"source": "fm", "destination": name})
    assert r.status_code == 400 and "destination" in r.json()["error"], r.text
    # ... so the pull of that name still works and serves the hub's file.
    assert (await client.post("/api/pull", json={"model": Q8, "stream": False})).is_success
    models = client.app.state.models  # type: ignore[attr-defined]
    assert models.get(Q8).pulled and models.get(Q8) is not models.default


async def test_an_adapter_fetched_by_hf_repo_is_neither_listed_nor_deleted(
    tmp_path: Path, hub: StandIn
) -> None:
    adapter = _cached(tmp_path, ADAPTERS, "adapter.gguf")
    lora = LoraSection(id="style", hf_repo=ADAPTERS)
    app = _app(tmp_path, ModelSection(id="fake-model", loras=(lora,)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        assert await _tags(c) == ["fake-model:latest"]
        r = await _delete(c, f"hf.co/{ADAPTERS}:latest")
        assert r.status_code == 404
        # Pulled by name: refused, naming what owns it (it is served, or used, as that).
        r = await c.post("/api/pull", json={"model": f"hf.co/{ADAPTERS}", "stream": False})
        assert r.status_code == 400 and "adapter 'style'" in r.json()["error"], r.text
        assert await _tags(c) == ["fake-model:latest"]
    assert adapter.exists()


async def test_a_configured_path_inside_the_hub_cache_is_not_a_pulled_model(
    tmp_path: Path, hub: StandIn
) -> None:
    configured = _cached(tmp_path, REPO, "tiny-Q8_0.gguf")
    _cached(tmp_path, REPO, "tiny-Q4_K_M.gguf")  # pulled earlier: a pulled model
    app = _app(tmp_path, ModelSection(id="fake-model"),
               ModelSection(id="local", path=str(configured)))  # fmt: skip
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        assert await _tags(c) == ["fake-model:latest", "local:latest", Q4]
        assert (await _delete(c, Q8)).status_code == 404
        r = await c.post("/api/pull", json={"model": Q8, "stream": False})
        assert r.status_code == 400 and "configured model 'local'" in r.json()["error"], r.text
        r = await _delete(c, "local")
        assert r.status_code == 400 and "configured model" in r.json()["error"]
        # The other file of that repository is pulled, and deletable; the configured one stays.
        assert (await _delete(c, Q4)).status_code == 200
        assert await _tags(c) == ["fake-model:latest", "local:latest"]
    assert configured.exists()
