"""Ollama's keep_alive on a shared server (server/models/keep_alive.py): checked with the body,
applied once the request has passed, bounded by the operator's settings, and changed
for everyone only by a caller who may manage models."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from engine.client import EngineState
from server.app import create_app
from server.config.tree import AuthSection, ModelSection, Settings
from server.errors import BadRequest
from server.models.keep_alive import parse_keep_alive
from tests.fakes import FakeEngine

ADMIN, USER, OTHER = "sk-admin", "sk-user", "sk-other"
MODEL = "fake-model"


class Counted(FakeEngine):
    """Starts (loads) counted."""

    def __init__(self) -> None:
        super().__init__()
        self.num_starts = 0

    def start(self) -> None:
        self.num_starts += 1
        super().start()


@pytest.fixture
async def app() -> AsyncIterator[Any]:
    settings = Settings(
        models=(ModelSection(id=MODEL, idle_unload_s=300),),  # the operator: 5 minutes
        auth=AuthSection(api_keys=(USER, OTHER), admin_api_keys=(ADMIN,)),
    )
    app = create_app(settings, Counted())
    yield app
    app.state.models.default.engine.close()


def _as(app: Any, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t",
                             headers={"Authorization": f"Bearer {key}"})  # fmt: skip


def _generate(keep_alive: Any, **body: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "hi", "stream": False, "keep_alive": keep_alive, **body}


async def test_a_bad_keep_alive_is_a_400_before_the_model_loads(app: Any) -> None:
    served = app.state.models.default
    served.engine.state = EngineState.UNLOADED
    async with _as(app, ADMIN) as c:
        for bad in ("soon", [], True, "5x"):
            r = await c.post("/api/generate", json=_generate(bad))
            assert r.status_code == 400 and "keep_alive" in r.json()["error"], r.text
    assert served.engine.num_starts == 0 and served.engine.state is EngineState.UNLOADED


async def test_keep_alive_applies_only_once_the_request_passes(app: Any) -> None:
    served = app.state.models.default
    async with _as(app, ADMIN) as c:
        r = await c.post("/api/generate", json=_generate("10m", options={"nonsense": 1}))
        assert r.status_code == 400 and "options.nonsense" in r.json()["error"]
        r = await c.post("/api/chat", json={"model": MODEL, "keep_alive": -1, "stream": False,
                                            "messages": [{"role": "robot", "content": "x"}]})  # fmt: skip
        assert r.status_code == 400
        r = await c.post("/api/embed", json={"model": MODEL, "keep_alive": 0,
                                             "input": ["a", ""]})  # fmt: skip
        assert r.status_code == 400
        assert served.keep_alive_s is None and served.unload_after_s == 300
        assert served.engine.state is EngineState.READY
        r = await c.post("/api/generate", json=_generate("10m"))
        assert r.status_code == 200 and served.unload_after_s == 600


@pytest.mark.parametrize(
    ("keep_alive", "now"),
    [(0, "unloaded after 300 s idle"), (-1, "unloaded after 300 s idle"), ("1h", "300 s")],
)
async def test_a_user_key_cannot_change_residency_for_everyone(
    app: Any, keep_alive: Any, now: str
) -> None:
    served = app.state.models.default
    async with _as(app, USER) as c:
        r = await c.post("/api/generate", json=_generate(keep_alive))
    assert r.status_code == 403, r.text
    error = r.json()["error"]
    assert "keep_alive" in error and now in error and "admin key" in error
    # Neither unloaded for every tenant nor kept past the operator's idle_unload_s.
    assert served.engine.state is EngineState.READY and served.unload_after_s == 300
    assert not served.engine.submitted


async def test_a_user_key_may_ask_for_what_the_model_does(app: Any) -> None:
    """A client that always sends keep_alive works where it matches the server."""
    async with _as(app, USER) as c:
        for same in ("5m", 300, "300"):
            r = await c.post("/api/generate", json=_generate(same))
            assert r.status_code == 200, r.text
        r = await c.post("/api/generate", json=_generate(None))
        assert r.status_code == 200
    assert app.state.models.default.unload_after_s == 300


async def test_an_admins_keep_alive_holds_for_every_tenant(app: Any) -> None:
    served = app.state.models.default
    async with _as(app, ADMIN) as admin, _as(app, USER) as user, _as(app, OTHER) as other:
        assert (await admin.post("/api/generate", json=_generate(-1))).status_code == 200
        assert served.unload_after_s is None
        # Other tenants' requests without keep_alive do not undo it (Ollama's would).
        assert (await user.post("/api/generate", json=_generate(None))).status_code == 200
        assert served.unload_after_s is None
        # ... and asking for what it is now is fine, anything else is not.
        assert (await other.post("/api/generate", json=_generate("-1m"))).status_code == 200
        assert (await other.post("/api/generate", json=_generate("5m"))).status_code == 403
        # The admin's 0 unloads it; then the operator's 5 minutes are back.
        r = await admin.post("/api/generate", json={"model": MODEL, "keep_alive": 0})
        assert r.json()["done_reason"] == "unload"
        assert served.engine.state is EngineState.UNLOADED and served.unload_after_s == 300
        # A user's request loads it again, as any request does.
        assert (await user.post("/api/generate", json=_generate(None))).status_code == 200
        assert served.engine.state is EngineState.READY


async def test_a_refused_keep_alive_does_not_load_the_model(app: Any) -> None:
    served = app.state.models.default
    served.engine.state = EngineState.UNLOADED
    async with _as(app, USER) as c:
        r = await c.post("/api/chat", json={"model": MODEL, "keep_alive": 0, "messages": []})
    assert r.status_code == 403 and "keep_alive" in r.json()["error"]
    assert served.engine.num_starts == 0


HUGE = int("1" + "0" * 400)  # past a float's range: float(HUGE) raises OverflowError


@pytest.mark.parametrize("path", ["/api/generate", "/api/chat", "/api/embed"])
# 3.1e103 (a float, finite) came from the schema fuzzer: /api/ps's expiry overflowed.
@pytest.mark.parametrize("huge", [HUGE, -HUGE, str(HUGE), "9" * 5000, 3.1188278695140285e+103,
                                  "2562048h"])  # fmt: skip
async def test_a_keep_alive_past_a_floats_range_means_for_ever_not_a_500(
    app: Any, path: str, huge: Any
) -> None:
    """As `1e400` (JSON's inf) does: an admin's request keeps the model loaded."""
    body: dict[str, Any] = {"model": MODEL, "stream": False, "keep_alive": huge}
    if path == "/api/generate":
        body["prompt"] = "hi"
    elif path == "/api/chat":
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["input"] = "hi"
        engine = app.state.models.default.engine
        engine._info = dataclasses.replace(engine.info, embed_n_ctx=64)  # embeds
    async with _as(app, ADMIN) as c:
        r = await c.post(path, json=body)
    assert r.status_code == 200, r.text
    assert app.state.models.default.unload_after_s is None  # never unloaded
    async with _as(app, ADMIN) as c:
        listed = await c.get("/api/ps")
    assert listed.status_code == 200, listed.text


def test_a_long_string_that_is_no_duration_is_refused_at_once() -> None:
    """The duration's pattern split a run of digits every way it could: 5,000 digits
    without a unit took minutes to refuse, on the event loop."""
    start = time.monotonic()
    with pytest.raises(BadRequest):
        parse_keep_alive("9" * 20_000 + "x")
    assert time.monotonic() - start < 1.0
    assert parse_keep_alive("1h30m") == 5400 and parse_keep_alive(".5s") == 0.5
