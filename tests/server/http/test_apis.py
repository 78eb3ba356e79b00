"""One registration per API (server/http/apis.py): every package under server/api/ exports
one spec that server/app.py lists, and a new API is its package plus one line there: its
routes mounted behind the key, its errors in its own shape, its model names read its way."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Annotated, Any

import httpx
import pytest
from fastapi import APIRouter

import server.app
from server import errors
from server.api.common import RequestModel
from server.app import APIS, create_app
from server.config.tree import AuthSection, ModelNamesSection, Settings
from server.errors import BadRequest
from server.http.apis import BY_ID, Apis, ApiSpec
from server.http.lease import Lease, leased
from server.models.served import ModelRegistry, ServedModel
from tests.fakes import FakeEngine
from tests.test_layering import api_packages


def test_every_api_package_exports_one_spec_and_the_app_lists_each_once() -> None:
    specs = [importlib.import_module(f"server.api.{name}").API for name in api_packages()]
    assert all(isinstance(spec, ApiSpec) for spec in specs)
    assert sorted(spec.name for spec in APIS.specs) == api_packages()
    assert {id(spec) for spec in APIS.specs} == {id(spec) for spec in specs}


def test_the_specs_name_the_shapes_and_the_model_names_that_differ() -> None:
    shapes = {shape.prefixes for shape in APIS.error_shapes()}
    assert shapes == {("/v1/messages",), ("/api/",)}  # Anthropic's and Ollama's; OpenAI's else
    ollama = {path for path, names in APIS.model_names.items() if names is not BY_ID}
    assert {"/api/chat", "/api/generate", "/api/embed", "/api/embeddings"} <= ollama
    assert "/v1/chat/completions" not in APIS.model_names  # by id or alias


class ToyRequest(RequestModel):
    model: str
    text: str


toy = APIRouter()


@toy.post("/toy/echo")
async def echo(lease: Annotated[Lease[ToyRequest], leased(ToyRequest)]) -> Any:
    if not lease.body.text:
        raise BadRequest("'text' is empty", param="text")
    assert lease.served is not None
    return {"model": lease.served.id, "text": lease.body.text}


def toy_names(models: ModelRegistry, name: str) -> ServedModel | None:
    return models.get(name.removeprefix("toy/"))


TOY = ApiSpec("toy", routers=(toy,), prefixes=("/toy/",),
              error_body=lambda err: {"toy_error": err.message}, model_names=toy_names)  # fmt: skip


@pytest.fixture
def one_more_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The one line a new API adds to server/app.py's list."""
    monkeypatch.setattr(server.app, "APIS", Apis([*APIS.specs, TOY]))
    yield
    errors._shapes[:] = APIS.error_shapes()  # module-wide: as every other app installs them


async def test_a_new_api_is_its_package_and_one_line(one_more_api: None) -> None:
    names = ModelNamesSection(any_with_one_model=False)  # only the toy's rule finds the model
    settings = Settings(auth=AuthSection(api_keys=("k",)), model_names=names)
    app = create_app(settings, engines={"fake-model": FakeEngine()})
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        body = {"model": "toy/fake-model", "text": "hi"}
        response = await client.post("/toy/echo", json=body)
        assert response.status_code == 401 and "toy_error" in response.json()
        key = {"Authorization": "Bearer k"}
        response = await client.post("/toy/echo", json=body, headers=key)
        assert response.json() == {"model": "fake-model", "text": "hi"}
        response = await client.post("/toy/echo", json={**body, "text": ""}, headers=key)
        assert response.status_code == 400
        assert response.json() == {"toy_error": "'text' is empty"}
        # the other APIs are as they were
        chat = {"model": "toy/fake-model", "messages": [{"role": "user", "content": "hi"}]}
        response = await client.post("/v1/chat/completions", json=chat, headers=key)
        assert response.status_code == 404 and response.json()["error"]["param"] == "model"
