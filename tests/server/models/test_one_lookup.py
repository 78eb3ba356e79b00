"""A route's model dependency resolves the request's model once and hands it to the route
(server/http/lease.py -> deps.leased_model): the route does not look the name up again."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from server.config.tree import ModelNamesSection, Settings
from server.models.served import ModelRegistry
from tests.conftest import ClientFactory
from tests.fakes import FakeEngine

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every name ModelRegistry.find is asked for."""
    names: list[str] = []
    find = ModelRegistry.find

    def counted(self: ModelRegistry, name: str) -> Any:
        names.append(name)
        return find(self, name)

    monkeypatch.setattr(ModelRegistry, "find", counted)
    return names


async def test_a_chat_request_looks_its_model_up_once(
    client: httpx.AsyncClient, lookups: list[str]
) -> None:
    model = (await client.get("/v1/models")).json()["data"][0]["id"]
    lookups.clear()
    response = await client.post("/v1/chat/completions", json={"model": model, **CHAT})
    assert response.status_code == 200, response.text
    assert lookups == [model]


async def test_an_ollama_chat_looks_its_model_up_once(
    client: httpx.AsyncClient, lookups: list[str]
) -> None:
    model = (await client.get("/v1/models")).json()["data"][0]["id"]
    lookups.clear()
    body = {"model": model, "stream": False, **CHAT}
    response = await client.post("/api/chat", json=body)
    assert response.status_code == 200, response.text
    assert lookups == [model]


async def test_an_unknown_model_is_still_the_routes_404(
    make_client: ClientFactory, fake: FakeEngine, lookups: list[str]
) -> None:
    names = ModelNamesSection(any_with_one_model=False)  # else one model answers any name
    client = make_client(fake, settings=Settings(model_names=names))
    response = await client.post("/v1/chat/completions", json={"model": "nope", **CHAT})
    assert response.status_code == 404
    assert response.json()["error"]["param"] == "model"
