from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
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


# The folders whose tests run the real default model (all of them, and only those).
MODEL_LAYERS = ("e2e", "integration", "reliability")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = item.path.parts
        layer = parts[parts.index("tests") + 1] if "tests" in parts else ""
        marker = LAYER_MARKERS.get(layer)
        if marker is not None:
            item.add_marker(marker)
        if layer in ("e2e", "integration"):
            item.add_marker("model")  # both run the real default model
        if item.get_closest_marker("model") is not None and layer not in MODEL_LAYERS:
            # the scheduler below finds the model tests by their folder
            raise pytest.UsageError(f"{item.nodeid}: a model test outside {MODEL_LAYERS}")


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist (`-n auto`, as .ci/run runs the suite) every test on the real model
    goes to one worker, in collection order as in a serial run, and the tests without a
    model are spread over the workers, so they run beside it. Why one worker: llama.cpp's
    threads spin while they compute, so two workers that both run the model on 2 cores
    wait on each other's time slices; the reliability tests share one server (package
    scope) and their timing assumes that nothing else runs the model beside them; the
    e2e modules' servers are module-scoped. (xdist's own `xdist_group` mark cannot do
    this here: its loadgroup rewrites `item._nodeid`, which pytest 9.2's nodes no longer
    read.)"""
    if config.getoption("dist") not in ("load", "loadgroup"):
        return None
    from xdist.scheduler import LoadGroupScheduling

    class ModelTestsOnOneWorker(LoadGroupScheduling):
        def add_node_collection(self, node: Any, collection: Sequence[str]) -> None:
            # Scope scheduling keys its work by node id, but schemathesis's generated tests
            # (one per API operation) share one: the repeats get a suffix of their own,
            # else all but one of them would silently not run.
            seen: collections.Counter[str] = collections.Counter()
            unique = []
            for nodeid in collection:
                unique.append(f"{nodeid}#{seen[nodeid]}" if seen[nodeid] else nodeid)
                seen[nodeid] += 1
            super().add_node_collection(node, unique)

        def _split_scope(self, nodeid: str) -> str:
            # xdist hands out the largest unit first: the model tests start at once
            folders = nodeid.split("::")[0].split("/")  # tests/<layer>/...
            if len(folders) > 2 and folders[1] in MODEL_LAYERS:
                return "model"
            return super()._split_scope(nodeid)

    return ModelTestsOnOneWorker(config, log)


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
