from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from server.app import create_app
from server.config import AuthSection, ServerSection, Settings
from tests.fakes import FakeEngine

ClientFactory = Callable[..., httpx.AsyncClient]


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
async def make_client() -> AsyncIterator[ClientFactory]:
    """Build an httpx client on the app over a given engine, with server settings."""
    clients: list[httpx.AsyncClient] = []

    def build(
        engine: Any,
        *,
        api_keys: tuple[str, ...] = (),
        admin_api_keys: tuple[str, ...] = (),
        **server: Any,
    ) -> httpx.AsyncClient:
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
