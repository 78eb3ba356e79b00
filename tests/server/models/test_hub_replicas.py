"""Two replicas on one hub cache directory (issue 28, item 18): a model pulled on one is
listed and served by the other, and one deleted there leaves the other's list once it
is not loaded there. Two app instances (fake engines) and a hub stand-in on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from huggingface_hub import constants

from server.app import create_app
from server.config.tree import HubSection, ModelNamesSection, ModelSection, Settings
from tests.fakes import FakeEngine
from tests.helpers.hub_standin import HubFile, StandIn, fake_gguf, serving

REPO = "kvtest/tiny-GGUF"
NAME = f"hf.co/{REPO}:Q8_0"
CHAT = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[StandIn]:
    hub = StandIn({REPO: {"tiny-Q8_0.gguf": HubFile(fake_gguf(tmp_path))}})
    with serving(hub) as stand_in:
        monkeypatch.setattr(constants, "ENDPOINT", stand_in.url)
        template = stand_in.url + "/{repo_id}/resolve/{revision}/{filename}"
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        yield stand_in


@pytest.fixture
async def replicas(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, ...]]:
    shared = HubSection(cache_dir=str(tmp_path / "hf"))  # one volume, mounted by both
    clients = []
    for _ in range(2):
        settings = Settings(models=(ModelSection(id="fake-model"),), hub=shared,
                            model_names=ModelNamesSection(any_with_one_model=False))  # fmt: skip
        app = create_app(settings, FakeEngine())
        # Pulled models load as fakes (the file is a GGUF by its magic only).
        app.state.hub_models.make_engine = lambda model_id, path: FakeEngine(model_id=model_id)
        transport = httpx.ASGITransport(app=app)
        clients.append(httpx.AsyncClient(transport=transport, base_url="http://t"))
    yield tuple(clients)
    for c in clients:
        await c.aclose()


def _names(r: httpx.Response) -> list[str]:
    assert r.status_code == 200, r.text
    return [m["name"] for m in r.json()["models"]]


async def test_a_pull_on_one_replica_is_served_by_the_other(
    hub: StandIn, replicas: tuple[httpx.AsyncClient, ...]
) -> None:
    a, b = replicas
    assert _names(await b.get("/api/tags")) == ["fake-model:latest"]
    r = await a.post("/api/pull", json={"model": NAME, "stream": False})
    assert r.status_code == 200, r.text
    # A request naming it on b: found on a miss (b had not looked since), loaded, served.
    r = await b.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 200, r.text
    assert _names(await b.get("/api/tags")) == ["fake-model:latest", NAME]
    assert hub.downloads == ["tiny-Q8_0.gguf"]  # one download, for both


async def test_the_list_follows_the_directory_on_tags_and_on_models(
    hub: StandIn, replicas: tuple[httpx.AsyncClient, ...]
) -> None:
    a, b = replicas
    assert (await a.post("/api/pull", json={"model": NAME, "stream": False})).is_success
    assert _names(await b.get("/api/tags")) == ["fake-model:latest", NAME]
    # Loaded on b, then deleted on a: b keeps serving it while it is loaded there ...
    assert (await b.post("/v1/chat/completions", json=CHAT)).status_code == 200
    r = await a.request("DELETE", "/api/delete", json={"model": NAME})
    assert r.status_code == 200, r.text
    assert _names(await a.get("/api/tags")) == ["fake-model:latest"]
    assert _names(await b.get("/api/tags")) == ["fake-model:latest", NAME]
    # ... and lists it no more once unloaded.
    assert (await b.post(f"/v1/models/{NAME}/unload")).status_code == 200
    ids = [m["id"] for m in (await b.get("/v1/models")).json()["data"]]
    assert ids == ["fake-model"]
    r = await b.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 404, r.text


async def test_a_name_that_is_not_a_hub_name_does_not_scan(
    replicas: tuple[httpx.AsyncClient, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, _ = replicas
    hub_models: Any = a._transport.app.state.hub_models  # type: ignore[attr-defined]
    scans: list[str] = []
    monkeypatch.setattr(hub_models, "rescan", lambda: scans.append("scan") or True)
    body = {**CHAT, "model": "gpt-4"}
    assert (await a.post("/v1/chat/completions", json=body)).status_code == 404
    assert scans == []
    assert (await a.post("/v1/chat/completions", json=CHAT)).status_code == 404
    assert scans  # a hub name not served here: looked for
