from __future__ import annotations

import dataclasses
import os
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest

from server.app import create_app
from server.config.tree import AuthSection, ServerSection, Settings
from tests.fakes import FakeEngine

ClientFactory = Callable[..., httpx.AsyncClient]

# Session fixtures with models of other families (family_models, gemma3_270m).
pytest_plugins = ["tests.helpers.family_models"]

# The layers a quick loop can leave out by marker (`pytest -m "not e2e"`, `-m "not model"`):
# every test under a layer's directory carries its marker.
LAYER_MARKERS = {"e2e": "e2e", "integration": "integration", "reliability": "model"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = item.path.parts
        layer = parts[parts.index("tests") + 1] if "tests" in parts else ""
        marker = LAYER_MARKERS.get(layer)
        if marker is not None:
            item.add_marker(marker)
        if layer in ("e2e", "integration"):
            item.add_marker("model")  # both run the real default model


@pytest.fixture(scope="session", autouse=True)
def private_cache_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The disk tier is on by default ($XDG_CACHE_HOME/kvserve): no test writes to the real
    home. (tests/kvserve_process.py gives each server process its own directory too.)"""
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if old is None:
        del os.environ["XDG_CACHE_HOME"]
    else:
        os.environ["XDG_CACHE_HOME"] = old


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
async def make_client() -> AsyncIterator[ClientFactory]:
    """Build an httpx client on the app over a given engine, with server settings (or
    the whole `settings`)."""
    clients: list[httpx.AsyncClient] = []

    def build(
        engine: Any,
        *,
        api_keys: tuple[str, ...] = (),
        admin_api_keys: tuple[str, ...] = (),
        settings: Settings | None = None,
        **server: Any,
    ) -> httpx.AsyncClient:
        if settings is None:  # else the whole settings are given
            settings = Settings(
                server=dataclasses.replace(ServerSection(), **server),
                auth=AuthSection(api_keys=api_keys, admin_api_keys=admin_api_keys),
            )
        app = create_app(settings, engine=engine)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
        clients.append(client)
        return client

    yield build
    for client in clients:
        await client.aclose()


@pytest.fixture
async def client(make_client: ClientFactory, fake: FakeEngine) -> httpx.AsyncClient:
    return make_client(fake)
