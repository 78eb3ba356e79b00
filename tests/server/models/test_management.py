"""Who may manage models ([server] model_management, server/http/management.py): every
management route against every kind of caller, in each API's own error shape; the
pairs it meets (tenants, an unload while a request runs); the shipped defaults."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from engine.client import EngineState
from server.app import create_app
from server.config.tree import (
    AuthSection,
    HubSection,
    ModelSection,
    ServerSection,
    Settings,
    load_settings,
)
from tests.fakes import FakeEngine
from tests.helpers.hub_standin import HubFile, StandIn, fake_gguf, point_hub_at, serving

ADMIN, USER = "sk-admin", "sk-user"
ROOT = Path(__file__).resolve().parents[3]
REPO = "kvtest/tiny-GGUF"
PULLED = f"hf.co/{REPO}:Q8_0"
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}

# (method, path, body, the status once management is allowed): bodies that pass or fail
# after the check, so a 401/403 can only come from it.
ROUTES = [
    ("POST", "/api/pull", {"model": "llama3.2"}, 400),  # allowed: then "only Hugging Face"
    ("DELETE", "/api/delete", {"model": "nope"}, 404),
    ("POST", "/api/copy", {"source": "fm", "destination": "mine"}, 200),
    ("POST", "/v1/models/fake-model/load", None, 200),
    ("POST", "/v1/models/fake-model/unload", None, 200),
    ("POST", "/api/generate", {"model": "fake-model", "keep_alive": "10m"}, 200),
]
# (server settings, keys on, the key sent) -> None (allowed) or (status, code, words)
CALLERS: dict[str, tuple[dict[str, Any], bool, str | None, Any]] = {
    "loopback, no keys": ({"host": "127.0.0.1"}, False, None, None),
    "::1, no keys": ({"host": "::1"}, False, None, None),
    "0.0.0.0, no keys": ({"host": "0.0.0.0"}, False, None,
                         (403, "model_management_off", "listens on 0.0.0.0")),
    "user key": ({}, True, USER, (403, "admin_key_required", "takes an admin key")),
    "admin key": ({"host": "0.0.0.0"}, True, ADMIN, None),
    "no key": ({}, True, None, (401, "invalid_api_key", "API key")),
    "wrong key": ({}, True, "sk-nope", (401, "invalid_api_key", "API key")),
    "off, admin key": ({"model_management": "off"}, True, ADMIN,
                       (403, "model_management_off", "turned off")),
    "off, no keys": ({"model_management": "off"}, False, None,
                     (403, "model_management_off", "turned off")),
    "on, 0.0.0.0, no keys": ({"host": "0.0.0.0", "model_management": "on"}, False, None, None),
    "on, user key": ({"model_management": "on"}, True, USER,
                     (403, "admin_key_required", "admin key")),
}  # fmt: skip


def _app(tmp_path: Path, server: dict[str, Any], keys: bool, engine: FakeEngine) -> Any:
    settings = Settings(
        server=ServerSection(**server),
        models=(ModelSection(id="fake-model", aliases=("fm",)),),
        hub=HubSection(cache_dir=str(tmp_path / "hf")),
        auth=AuthSection(api_keys=(USER,), admin_api_keys=(ADMIN,)) if keys else AuthSection(),
    )
    return create_app(settings, engine)


def _client(app: Any, key: str | None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    transport = httpx.ASGITransport(app=app)
    return httpx.AsyncClient(transport=transport, base_url="http://t", headers=headers)


def _message(r: httpx.Response) -> tuple[str, str | None]:
    """The error text and code, checking the route's own shape: Ollama's one string on
    /api, OpenAI's object on /v1."""
    body = r.json()
    if r.url.path.startswith("/api/"):
        assert list(body) == ["error"] and isinstance(body["error"], str), body
        return body["error"], None
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]["message"], body["error"]["code"]


@pytest.mark.parametrize("caller", list(CALLERS))
@pytest.mark.parametrize(("method", "path", "body", "allowed"), ROUTES)
async def test_who_may_manage_models(
    tmp_path: Path, caller: str, method: str, path: str, body: Any, allowed: int
) -> None:
    server, keys, key, refused = CALLERS[caller]
    engine = FakeEngine()
    app = _app(tmp_path, server, keys, engine)
    async with _client(app, key) as c:
        r = await c.request(method, path, json=body)
    served = app.state.models.default
    if refused is None:
        assert r.status_code == allowed, r.text
        return
    status, code, words = refused
    assert r.status_code == status, r.text
    message, given_code = _message(r)
    assert words in message, message
    if given_code is not None:
        assert given_code == code
    if path == "/api/generate" and status == 403:
        assert "keep_alive" in message
    # Nothing happened: no name, no unload, no keep_alive.
    assert app.state.models.get("mine") is None and engine.state is EngineState.READY
    assert served.keep_alive_s is None


def test_a_bad_setting_is_refused_by_name() -> None:
    with pytest.raises(Exception, match=r"server\.model_management: one of auto, on, off"):
        load_settings(env={"KVSERVE_SERVER_MODEL_MANAGEMENT": "maybe"})


def _image_env() -> dict[str, str]:
    """The KVSERVE_* variables the Docker image sets, and those deploy/ adds."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    env = dict(re.findall(r"\b(KVSERVE_[A-Z_]+)=(\S+)", dockerfile))
    compose = yaml.safe_load((ROOT / "deploy" / "docker-compose.yml").read_text())
    env.update({k: str(v) for k, v in compose["x-kvserve"]["environment"].items()})
    return env


async def test_the_image_and_deploy_refuse_management_by_default(tmp_path: Path) -> None:
    env = _image_env()
    assert env["KVSERVE_SERVER_HOST"] == "0.0.0.0"  # what makes the default matter
    # Who may manage models: the server's and the auth keys (the cache's need its Redis).
    settings = load_settings(env={k: v for k, v in env.items() if "_CACHE_" not in k})
    assert not settings.auth.enabled and settings.server.model_management == "auto"
    app = create_app(settings, FakeEngine(model_id=settings.models[0].id))
    async with _client(app, None) as c:
        r = await c.request("DELETE", "/api/delete", json={"model": settings.models[0].id})
        assert r.status_code == 403 and "beyond this machine" in r.json()["error"]
        r = await c.post(f"/v1/models/{settings.models[0].id}/unload")
        assert r.status_code == 403 and r.json()["error"]["code"] == "model_management_off"
        # Serving is not management: a chat still works.
        body = {**CHAT, "model": settings.models[0].id}
        assert (await c.post("/v1/chat/completions", json=body)).status_code == 200


# -- the pairs ---------------------------------------------------------------------------


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[StandIn]:
    gguf = fake_gguf(tmp_path)
    with serving(StandIn({REPO: {"tiny-Q8_0.gguf": HubFile(gguf)}})) as stand_in:
        point_hub_at(stand_in, monkeypatch)
        yield stand_in


@pytest.fixture
async def tenants(
    tmp_path: Path,
) -> AsyncIterator[tuple[Any, httpx.AsyncClient, httpx.AsyncClient]]:
    engine = FakeEngine(delay=0.02)
    app = _app(tmp_path, {}, True, engine)
    async with _client(app, ADMIN) as admin, _client(app, USER) as user:
        yield app, admin, user
    for model in app.state.models:
        model.engine.close()


async def test_a_user_key_cannot_delete_or_repoint_what_an_admin_pulled(
    tenants: Any, hub: StandIn
) -> None:
    app, admin, user = tenants
    r = await admin.post("/api/pull", json={"model": PULLED, "stream": False})
    assert r.status_code == 200, r.text
    served = app.state.models.get(PULLED)
    assert (
        await user.post("/api/pull", json={"model": PULLED, "stream": False})
    ).status_code == 403
    r = await user.request("DELETE", "/api/delete", json={"model": PULLED})
    assert r.status_code == 403 and "admin key" in r.json()["error"]
    assert app.state.models.get(PULLED) is served and Path(served.path).exists()
    assert (
        await admin.post("/api/copy", json={"source": PULLED, "destination": "mine"})
    ).is_success
    # The user can neither re-point the admin's copy nor remove it, but may use it.
    r = await user.post("/api/copy", json={"source": "fm", "destination": "mine"})
    assert r.status_code == 403
    assert (await user.request("DELETE", "/api/delete", json={"model": "mine"})).status_code == 403
    assert app.state.models.get("mine") is served
    tags = [m["name"] for m in (await user.get("/api/tags")).json()["models"]]
    assert PULLED in tags  # listing is not management


async def test_an_unload_while_a_request_runs(tenants: Any) -> None:
    app, admin, user = tenants
    engine = app.state.models.default.engine
    running = asyncio.create_task(user.post("/v1/chat/completions", json=CHAT))
    while not engine.outstanding:
        await asyncio.sleep(0.005)
    r = await user.post("/v1/models/fake-model/unload")
    assert r.status_code == 403 and r.json()["error"]["code"] == "admin_key_required"
    r = await admin.post("/v1/models/fake-model/unload")
    assert r.status_code == 409 and r.json()["error"]["code"] == "model_busy"
    assert (await running).status_code == 200 and engine.state is EngineState.READY
    r = await admin.post("/v1/models/fake-model/unload")
    assert r.status_code == 200 and r.json()["meta"]["state"] == "unloaded"
    r = await user.post("/v1/models/fake-model/load")
    assert r.status_code == 403 and engine.state is EngineState.UNLOADED
    # A user's own request still loads an on-demand model: serving is not management.
    assert (await user.post("/v1/chat/completions", json=CHAT)).status_code == 200
    assert engine.state is EngineState.READY
