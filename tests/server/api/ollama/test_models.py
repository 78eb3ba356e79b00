"""Ollama's model management in process (fake engine, a hub stand-in on loopback):
/api/tags, /api/ps, /api/version, /api/copy, /api/delete, /api/pull, and their bad input."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.engine import EngineState
from server.api.ollama.show import quantization_level
from server.app import create_app
from server.config.tree import AuthSection, HubSection, ModelNamesSection, ModelSection, Settings
from tests.fakes import FakeEngine
from tests.helpers.hub_standin import HubFile, StandIn, fake_gguf, point_hub_at, serving

REPO = "kvtest/tiny-GGUF"
KEY = {"Authorization": "Bearer k"}


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    return fake_gguf(tmp_path)


@pytest.fixture
def hub(gguf: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[StandIn]:
    files = {"tiny-Q4_K_M.gguf": HubFile(gguf), "tiny-Q8_0.gguf": HubFile(gguf)}
    hub = StandIn({REPO: files, "kvtest/one-GGUF": {"one.Q4_1.gguf": HubFile(gguf)}})
    with serving(hub) as stand_in:
        point_hub_at(stand_in, monkeypatch)
        yield stand_in


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(
        models=(ModelSection(id="fake-model", aliases=("fm",)),),
        hub=HubSection(cache_dir=str(tmp_path / "hf")),
        auth=AuthSection(admin_api_keys=("k",)),  # model management takes an admin key
        # A name no model has is a 404 (else the one model answers it): what is deleted is gone.
        model_names=ModelNamesSection(any_with_one_model=False),
    )
    app = create_app(settings, FakeEngine())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=KEY) as c:
        c.app = app  # type: ignore[attr-defined]
        yield c
    for model in app.state.models:
        model.engine.close()


async def _lines(c: httpx.AsyncClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    r = await c.post("/api/pull", json=body)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in r.text.splitlines()]


async def test_tags_ps_version(client: httpx.AsyncClient) -> None:
    tags = (await client.get("/api/tags")).json()["models"]
    assert [m["name"] for m in tags] == ["fake-model:latest"]
    assert set(tags[0]) == {"name", "model", "modified_at", "size", "digest", "details"}
    assert tags[0]["details"]["format"] == "gguf"
    ps = (await client.get("/api/ps")).json()["models"]
    assert ps[0]["name"] == "fake-model:latest" and ps[0]["context_length"] == 512
    assert ps[0]["expires_at"] > "2300"  # never unloaded: Ollama's "forever"
    assert (await client.get("/api/version")).json()["version"]
    engine = client.app.state.models.default.engine  # type: ignore[attr-defined]
    engine.state = EngineState.UNLOADED
    assert (await client.get("/api/ps")).json() == {"models": []}


async def test_idle_unload_sets_expires_at(client: httpx.AsyncClient) -> None:
    client.app.state.models.default.idle_unload_s = 60  # type: ignore[attr-defined]
    ps = (await client.get("/api/ps")).json()["models"]
    assert ps[0]["expires_at"] < "2300"


async def test_copy_makes_a_name_that_serves_and_delete_removes_only_it(
    client: httpx.AsyncClient,
) -> None:
    assert (await client.post("/api/copy", json={"source": "fake-model:latest",
                                                 "destination": "mine"})).status_code == 200  # fmt: skip
    names = [m["name"] for m in (await client.get("/api/tags")).json()["models"]]
    assert names == ["fake-model:latest"]  # a copy is a name, not a second model
    body = {"model": "mine", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert (
        await client.request("DELETE", "/api/delete", json={"model": "mine"})
    ).status_code == 200
    assert (await client.post("/v1/chat/completions", json=body)).status_code == 404
    assert (
        await client.request("DELETE", "/api/delete", json={"model": "mine"})
    ).status_code == 404


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "says"),
    [
        ("DELETE", "/api/delete", {"model": "nope"}, 404, "model 'nope' not found"),
        ("DELETE", "/api/delete", {"model": "fake-model:latest"}, 400, "configured model"),
        ("DELETE", "/api/delete", {"model": "fm"}, 400, "configured alias"),
        ("DELETE", "/api/delete", {}, 400, "'model' is required"),
        ("DELETE", "/api/delete", {"model": 3}, 400, "'model' must be"),
        ("DELETE", "/api/delete", [1], 400, "JSON object"),
        ("POST", "/api/copy", {"source": "nope", "destination": "x"}, 404, "'nope' not found"),
        ("POST", "/api/copy", {"source": "fm"}, 400, "'destination' is required"),
        ("POST", "/api/copy", {"source": "fm", "destination": ""}, 400, "'destination' must"),
        ("POST", "/api/copy", {"source": "fm", "destination": "a b"}, 400, "destination"),
        ("POST", "/api/copy", {"destination": "x"}, 400, "'source' is required"),
        ("POST", "/api/pull", {"model": "llama3.2"}, 400, "only Hugging Face models"),
        ("POST", "/api/pull", {}, 400, "'model' is required"),
        ("POST", "/api/pull", {"model": "hf.co/a/b", "insecure": True}, 400, "'insecure'"),
        ("POST", "/api/pull", {"model": "hf.co/a/b", "insecure": "no"}, 400, "'insecure'"),
        ("POST", "/api/pull", {"model": "hf.co/a/b", "stream": "yes"}, 400, "'stream'"),
        ("POST", "/api/pull", {"model": "hf.co/a/b", "username": "u"}, 400, "'username'"),
        ("POST", "/api/pull", {"model": "hf.co/nope"}, 400, "only Hugging Face"),
    ],
)
async def test_bad_input(
    client: httpx.AsyncClient, method: str, path: str, body: Any, status: int, says: str
) -> None:
    r = await client.request(method, path, json=body)
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error"} and says in r.json()["error"]


async def test_copy_onto_another_model_is_refused(client: httpx.AsyncClient) -> None:
    r = await client.post("/api/copy", json={"source": "fm", "destination": "fake-model"})
    assert r.status_code == 200  # the same model: nothing to do
    assert (await client.post("/api/copy", json={"source": "fm", "destination": "c1"})).is_success
    assert (await client.post("/api/copy", json={"source": "c1", "destination": "c2"})).is_success
    assert (await client.request("DELETE", "/api/delete", json={"model": "c1"})).is_success
    assert (await client.post("/api/copy", json={"source": "c2", "destination": "c2"})).is_success


async def test_bad_body_and_api_keys(client: httpx.AsyncClient) -> None:
    r = await client.request("DELETE", "/api/delete", content=b"{nope")
    assert r.status_code == 400 and r.json() == {"error": "the request body is not valid JSON"}
    for path in ("/api/tags", "/api/ps"):
        r = await client.get(path, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and isinstance(r.json()["error"], str)
    r = await client.post("/api/pull", json={"model": "hf.co/a/b"}, headers={"Authorization": ""})
    assert r.status_code == 401


async def test_pull_streams_progress_then_serves_and_delete_removes_the_file(
    client: httpx.AsyncClient, hub: StandIn, gguf: Path, tmp_path: Path
) -> None:
    lines = await _lines(client, {"model": f"hf.co/{REPO}:Q8_0"})
    assert lines[0] == {"status": "pulling manifest"}
    progress = [x for x in lines if "digest" in x]
    size = gguf.stat().st_size
    assert progress and progress[-1]["completed"] == progress[-1]["total"] == size
    assert progress[0]["status"] == "pulling " + progress[0]["digest"][7:19]
    assert lines[-2] == {"status": f"serving as hf.co/{REPO}:Q8_0"}
    assert {"status": "verifying sha256 digest"} in lines and lines[-1] == {"status": "success"}
    assert hub.downloads == ["tiny-Q8_0.gguf"]
    tags = {m["name"]: m for m in (await client.get("/api/tags")).json()["models"]}
    pulled = tags[f"hf.co/{REPO}:Q8_0"]
    assert pulled["size"] == size and pulled["digest"] == progress[0]["digest"][7:]
    assert pulled["details"]["quantization_level"] == "Q8_0"
    served = client.app.state.models.get(f"hf.co/{REPO}:Q8_0")  # type: ignore[attr-defined]
    assert served.on_demand and served.engine.state is EngineState.UNLOADED  # until a request
    # Pulled again: a cache hit, the same model; without stream, one object.
    r = await client.post("/api/pull", json={"model": f"hf.co/{REPO}:q8_0", "stream": False})
    assert r.json() == {"status": "success"} and hub.downloads == ["tiny-Q8_0.gguf"]
    assert len((await client.get("/api/tags")).json()["models"]) == 2
    # Deleted: not served, its file gone from the cache (nothing else was cached).
    path = Path(served.path)
    r = await client.request("DELETE", "/api/delete", json={"model": f"hf.co/{REPO}:Q8_0"})
    assert r.status_code == 200, r.text
    assert not path.exists() and not (tmp_path / "hf" / "models--kvtest--tiny-GGUF").exists()
    assert len((await client.get("/api/tags")).json()["models"]) == 1
    await _lines(client, {"model": f"hf.co/{REPO}:Q8_0"})
    assert hub.downloads == ["tiny-Q8_0.gguf"] * 2


async def test_pull_latest_of_a_one_file_repo_answers_to_both_names(
    client: httpx.AsyncClient, hub: StandIn
) -> None:
    r = await client.post("/api/pull", json={"model": "hf.co/kvtest/one-GGUF", "stream": False})
    assert r.status_code == 200, r.text
    models = client.app.state.models  # type: ignore[attr-defined]
    served = models.get("hf.co/kvtest/one-GGUF:Q4_1")
    assert served is models.get("hf.co/kvtest/one-GGUF:latest")


@pytest.mark.parametrize(
    ("name", "status", "says"),
    [
        ("hf.co/kvtest/missing:Q8_0", 404, "repository kvtest/missing not found"),
        (f"hf.co/{REPO}:Q2_K", 404, "no GGUF file for quant Q2_K"),
        (f"hf.co/{REPO}", 400, "ambiguous"),
    ],
)
async def test_pull_failures(
    client: httpx.AsyncClient, hub: StandIn, name: str, status: int, says: str
) -> None:
    r = await client.post("/api/pull", json={"model": name, "stream": False})
    assert r.status_code == status and says in r.json()["error"], r.text
    lines = await _lines(client, {"model": name})
    assert lines[0] == {"status": "pulling manifest"} and says in lines[-1]["error"]
    assert len((await client.get("/api/tags")).json()["models"]) == 1


async def test_a_model_in_use_is_not_deleted(client: httpx.AsyncClient, hub: StandIn) -> None:
    await _lines(client, {"model": f"hf.co/{REPO}:Q8_0"})
    served = client.app.state.models.get(f"hf.co/{REPO}:Q8_0")  # type: ignore[attr-defined]
    served.in_flight = 1
    r = await client.request("DELETE", "/api/delete", json={"model": f"hf.co/{REPO}:Q8_0"})
    assert r.status_code == 409 and "in flight" in r.json()["error"]
    served.in_flight = 0
    assert Path(served.path).exists()


def test_ollama_names_the_quantization_as_ollama_does() -> None:
    assert quantization_level(38) == "MXFP4"  # llama.cpp: MXFP4_MOE
    assert quantization_level(7) == "Q8_0" and quantization_level(999) == "999"
    assert quantization_level("") == ""  # no general.file_type in the file
