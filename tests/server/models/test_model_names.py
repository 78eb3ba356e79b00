"""Names no model has (server/models/served.py, `requested_model`): agents name their
vendor's models. With one model served any name gets it (as llama-server does), unless
`[model_names] any_with_one_model` is off; `[model_names] aliases` globs map names onto
served models; every API resolves the same way."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from server.app import create_app
from server.config.tree import (
    ConfigError,
    HubSection,
    ModelNamesSection,
    ModelSection,
    Settings,
    load_settings,
)
from server.models.served import ModelRegistry, ServedModel
from tests.fakes import FakeEngine

USER = [{"role": "user", "content": "hi"}]
HAIKU = "claude-haiku-4-5-20251001"


def client_of(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


def one_model(**names: Any) -> Any:
    return create_app(Settings(model_names=ModelNamesSection(**names)), FakeEngine(model_id="m"))


async def ask(c: httpx.AsyncClient, api: str, model: str) -> httpx.Response:
    """A generation in `api`'s shape naming `model`."""
    if api == "openai":
        return await c.post("/v1/chat/completions", json={"model": model, "messages": USER})
    if api == "anthropic":
        body = {"model": model, "messages": USER, "max_tokens": 50}
        return await c.post("/v1/messages", json=body)
    return await c.post("/api/chat", json={"model": model, "messages": USER, "stream": False})


@pytest.mark.parametrize("api", ["openai", "anthropic", "ollama"])
async def test_one_model_answers_any_name(api: str) -> None:
    async with client_of(one_model()) as c:
        r = await ask(c, api, HAIKU)
    assert r.status_code == 200, r.text
    # OpenAI's and Anthropic's replies name the served model (as for an alias, as
    # llama-server does); Ollama's echo the name asked for, as Ollama does.
    assert r.json()["model"] == (HAIKU if api == "ollama" else "m")


@pytest.mark.parametrize("api", ["openai", "anthropic", "ollama"])
async def test_the_setting_restores_the_404_in_each_apis_shape(api: str) -> None:
    async with client_of(one_model(any_with_one_model=False)) as c:
        r = await ask(c, api, HAIKU)
        assert (await ask(c, api, "m")).status_code == 200
    assert r.status_code == 404, r.text
    body = r.json()
    if api == "openai":
        assert body["error"]["code"] == "model_not_found" and body["error"]["param"] == "model"
    elif api == "anthropic":
        assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
    else:
        assert HAIKU in body["error"]


async def test_model_management_names_models_exactly() -> None:
    """A stand-in answers generations; it never deletes, unloads or describes the model."""
    async with client_of(one_model()) as c:
        assert (await c.get("/v1/models/gpt-5-codex")).status_code == 404
        assert (await c.post("/v1/models/gpt-5-codex/unload")).status_code == 404
        assert (await c.post("/api/show", json={"model": HAIKU})).status_code == 404
        r = await c.request("DELETE", "/api/delete", json={"model": HAIKU})
        assert r.status_code == 404
        assert (await ask(c, "openai", "m")).status_code == 200


@pytest.fixture
def two() -> Any:
    settings = Settings(
        models=(ModelSection(id="a"), ModelSection(id="b", aliases=("bee",))),
        model_names=ModelNamesSection(aliases=("claude-*=bee", "gpt-*=a", "*codex*=b")),
    )
    engines = {"a": FakeEngine(model_id="a", reply="from a"), "b": FakeEngine(model_id="b",
               reply="from b")}  # fmt: skip
    return create_app(settings, engines=engines)


@pytest.mark.parametrize(
    "name,served",
    [("claude-haiku-4-5", "b"), ("Claude-Opus", "b"), ("gpt-4o", "a"), ("gpt-5-codex", "a"),
     ("my-codex", "b"), ("a", "a"), ("bee", "b")],
)  # fmt: skip
@pytest.mark.parametrize("api", ["openai", "anthropic", "ollama"])
async def test_alias_patterns_pick_among_several_models(
    two: Any, api: str, name: str, served: str
) -> None:
    """In order, first match wins (gpt-5-codex: gpt-* before *codex*); ids and aliases first."""
    async with client_of(two) as c:
        r = await ask(c, api, name)
    assert r.status_code == 200, r.text
    text = r.json()["message"]["content"] if api == "ollama" else r.text
    assert f"from {served}" in text


async def test_with_several_models_a_name_no_pattern_matches_is_a_404(two: Any) -> None:
    async with client_of(two) as c:
        r = await ask(c, "openai", "llama3")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_a_pattern_naming_no_served_model_is_a_config_error(tmp_path: Path) -> None:
    config = tmp_path / "k.toml"
    config.write_text('[model_names]\naliases = ["claude-*=qwen"]\n')
    with pytest.raises(ConfigError, match=r"model_names.aliases: 'claude-\*' names 'qwen'"):
        load_settings(str(config), env={})
    config.write_text('[model_names]\naliases = ["claude-*"]\n')
    with pytest.raises(ConfigError, match="model_names.aliases"):
        load_settings(str(config), env={})
    env = {
        "KVSERVE_MODEL_NAMES_ALIASES": "claude-*=SmolLM2-135M-Instruct,gpt-*=SmolLM2-135M-Instruct"
    }
    patterns = load_settings(env=env).model_names.patterns
    assert patterns == (("claude-*", "SmolLM2-135M-Instruct"), ("gpt-*", "SmolLM2-135M-Instruct"))
    # The registry refuses one too (models given to create_app directly, as tests do).
    with pytest.raises(ValueError, match="no model serves"):
        ModelRegistry([ServedModel("a", (), FakeEngine())], (("x*", "b"),))


async def test_an_unknown_hub_name_looks_at_the_hub_cache_once(tmp_path: Path) -> None:
    """Ollama's three spellings of a name looked at the hub cache once each, on every
    request; now once per request, and at most once a second."""
    settings = Settings(models=(ModelSection(id="m"),),
                        hub=HubSection(cache_dir=str(tmp_path / "hf")),
                        model_names=ModelNamesSection(any_with_one_model=False))  # fmt: skip
    app = create_app(settings, FakeEngine(model_id="m"))
    looks: list[float] = []

    def rescan() -> bool:
        looks.append(time.monotonic())
        return True

    app.state.hub_models.rescan = rescan
    async with client_of(app) as c:
        for _ in range(3):
            r = await ask(c, "ollama", "hf.co/org/nothing:Q4_K_M")
            assert r.status_code == 404
    assert len(looks) == 1
