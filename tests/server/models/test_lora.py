"""The `lora` request field and the adapters /v1/models lists, over the fake engine."""

from __future__ import annotations

import dataclasses

import httpx
import pytest

from engine.types import LoraAdapter
from server.app import create_app
from server.config.tree import LoraSection, ModelSection, Settings
from tests.fakes import FakeEngine

ADAPTERS = (LoraAdapter("pirate", "/x/p.gguf", 0.0), LoraAdapter("poet", "/x/q.gguf", 0.5))


@pytest.fixture
async def setup() -> tuple[httpx.AsyncClient, FakeEngine]:
    fake = FakeEngine()
    fake._info = dataclasses.replace(fake.info, loras=ADAPTERS)
    model = ModelSection(
        id="fake-model",
        loras=tuple(LoraSection(id=a.id, path=a.path, scale=a.scale) for a in ADAPTERS),
    )
    app = create_app(Settings(models=(model,)), engine=fake)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t"), fake


def _chat(lora: object = None) -> dict[str, object]:
    body: dict[str, object] = {
        "model": "fake-model",
        "messages": [{"role": "user", "content": "hi"}],
    }
    if lora is not None:
        body["lora"] = lora
    return body


async def test_lora_field_picks_the_set(setup: tuple[httpx.AsyncClient, FakeEngine]) -> None:
    client, fake = setup
    async with client:
        assert (await client.post("/v1/chat/completions", json=_chat())).status_code == 200
        assert fake.submitted[-1].lora == (("poet", 0.5),)  # the configured defaults
        lora = [{"id": "pirate", "scale": 0.8}, {"id": "poet", "scale": 0}]
        assert (await client.post("/v1/chat/completions", json=_chat(lora))).status_code == 200
        assert fake.submitted[-1].lora == (("pirate", 0.8),)  # zero scales drop out
        body = {"model": "fake-model", "prompt": "hi", "lora": [{"id": 1, "scale": 2}]}
        assert (await client.post("/v1/completions", json=body)).status_code == 200
        assert fake.submitted[-1].lora == (("poet", 2.0),)  # llama-server's index form
        assert (await client.post("/v1/completions", json={**body, "lora": []})).status_code == 200
        assert fake.submitted[-1].lora == ()  # an empty list: the base model


@pytest.mark.parametrize(
    ("lora", "message"),
    [
        ([{"id": "nope", "scale": 1}], "unknown LoRA adapter 'nope'"),
        ([{"id": 7}], "no adapter number 7"),
        ([{"id": "poet"}, {"id": "poet"}], "named twice"),
        ([{"id": "poet", "scale": 1000}], "lora"),
        ([{"id": "poet", "scale": "big"}], "lora"),
        ([{"scale": 1}], "lora"),
        ([{"id": "poet", "weight": 1}], "lora"),
        ({"id": "poet"}, "lora"),
    ],
)
async def test_bad_lora_is_a_400_naming_it(
    setup: tuple[httpx.AsyncClient, FakeEngine], lora: object, message: str
) -> None:
    client, fake = setup
    async with client:
        for path, body in (
            ("/v1/chat/completions", _chat(lora)),
            ("/v1/completions", {"model": "fake-model", "prompt": "hi", "lora": lora}),
        ):
            r = await client.post(path, json=body)
            assert r.status_code == 400, r.text
            assert message in r.text
            assert "lora" in (r.json()["error"]["param"] or "") or "lora" in r.text
    assert fake.submitted == []


async def test_models_list_adapters(setup: tuple[httpx.AsyncClient, FakeEngine]) -> None:
    client, _ = setup
    async with client:
        card = (await client.get("/v1/models")).json()["data"][0]
    assert card["meta"]["loras"] == [
        {"id": "pirate", "index": 0, "scale": 0.0},
        {"id": "poet", "index": 1, "scale": 0.5},
    ]
