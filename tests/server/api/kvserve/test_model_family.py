"""The load's family probe as the server shows it (/v1/models, /v1/status, /api/show),
and a model kvserve cannot serve loaded on demand: 400 naming it (issue 27)."""

from __future__ import annotations

import dataclasses

import httpx

from engine.client import EngineState, ModelFamily
from tests.conftest import ClientFactory
from tests.fakes import FakeEngine

SWA = ModelFamily("gemma3", n_swa=512, n_ctx_train=32768, n_params=268_098_176, n_layer=18,
                  n_embd=640, size_bytes=253_000_000, quantization="Q4_K_M")  # fmt: skip


def gemma_like() -> FakeEngine:
    fake = FakeEngine()
    fake._info = dataclasses.replace(fake._info, family=SWA, exact_min_rows=64)
    return fake


async def test_models_status_and_show_carry_the_probe(make_client: ClientFactory) -> None:
    client: httpx.AsyncClient = make_client(gemma_like())
    card = (await client.get("/v1/models")).json()["data"][0]["meta"]["family"]
    assert card["architecture"] == "gemma3" and card["memory"] == "sliding_window"
    assert (card["sliding_window"], card["recurrent"], card["hybrid"]) == (512, False, False)
    assert (card["quantization"], card["layers"], card["exact_reuse_rows"]) == ("Q4_K_M", 18, 64)
    status = (await client.get("/v1/status")).json()["models"][0]["family"]
    assert status == card
    show = (await client.post("/api/show", json={"model": "fake-model"})).json()
    info = show["model_info"]
    assert info["kvserve.memory"] == "sliding_window" and info["kvserve.sliding_window"] == 512
    assert info["kvserve.exact_reuse_rows"] == 64


async def test_exact_reuse_off_shows_no_recompute(make_client: ClientFactory) -> None:
    client = make_client(FakeEngine())
    card = (await client.get("/v1/models")).json()["data"][0]["meta"]["family"]
    assert card["memory"] == "attention" and card["exact_reuse_rows"] is None


async def test_the_warm_tail_and_its_reason_are_shown(make_client: ClientFactory) -> None:
    fake = FakeEngine()
    fake._info = dataclasses.replace(fake._info, warm_tail=(64, "flash attention's tile"))
    client = make_client(fake)
    card = (await client.get("/v1/models")).json()["data"][0]["meta"]["family"]
    assert (card["warm_start_rows"], card["warm_start_why"]) == (64, "flash attention's tile")
    show = (await client.post("/api/show", json={"model": "fake-model"})).json()
    assert show["model_info"]["kvserve.warm_start_rows"] == 64


async def test_a_model_refused_at_load_answers_400_naming_it(make_client: ClientFactory) -> None:
    fake = FakeEngine()
    fake.state, fake.load_refused = EngineState.FAILED, True
    fake.load_error = "model 'fake-model' cannot be served: it is a diffusion model (dream); ..."
    client = make_client(fake)
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "model_not_supported" and error["param"] == "model"
    assert "diffusion model" in error["message"]


def test_a_model_file_is_named_after_itself_unless_named() -> None:
    from server.config.model_entries import DEFAULT_MODEL_ID, ModelSection
    from server.config.tree import default_model_path

    assert ModelSection(path="/models/gemma-3-270m-q4_k_m.gguf").id == "gemma-3-270m-q4_k_m"
    assert ModelSection(path="/models/g.gguf", id="mine").id == "mine"
    assert ModelSection().id == DEFAULT_MODEL_ID  # the bundled model, by default or by path
    assert ModelSection(path=default_model_path()).id == DEFAULT_MODEL_ID
