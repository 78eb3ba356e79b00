"""LoRA adapters on the real default model, with adapter GGUFs written by the test."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cache import CacheConfig
from engine.engine import Engine, EngineConfig
from engine.types import InvalidRequestError, LoraAdapter
from server.config.tree import default_model_path
from tests.helpers.lora_gguf import write_lora
from tests.integration.test_engine import QUESTIONS, chat_prompt, request, run, start

pytestmark = pytest.mark.model

A1 = (("one", 1.0),)
A2 = (("two", 1.0),)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> tuple[LoraAdapter, ...]:
    folder = tmp_path_factory.mktemp("lora")
    return (
        LoraAdapter("one", str(write_lora(folder / "one.gguf", seed=1)), 0.0),
        LoraAdapter("two", str(write_lora(folder / "two.gguf", seed=2)), 0.0),
    )


@pytest.fixture
async def engine(adapters: tuple[LoraAdapter, ...]) -> AsyncIterator[Engine]:
    e = await start(loras=adapters, n_seq_max=4, n_threads=2, embeddings=False)
    yield e
    e.close()


async def text(engine: Engine, question: str, lora: tuple = (), **kw: object) -> str:
    prompt = chat_prompt(engine, question)
    return (await run(engine, request(prompt, max_tokens=24, lora=lora, **kw)))[0]


async def test_scale_changes_the_output(engine: Engine) -> None:
    base = await text(engine, QUESTIONS[0])
    assert await text(engine, QUESTIONS[0], lora=(("one", 0.0),)) == base
    one = await text(engine, QUESTIONS[0], lora=A1)
    two = await text(engine, QUESTIONS[0], lora=A2)
    assert base != one and base != two and one != two
    assert await text(engine, QUESTIONS[0]) == base  # the adapter is off again


async def test_different_adapters_in_flight_equal_their_solo_runs(engine: Engine) -> None:
    cases = [(QUESTIONS[1], ()), (QUESTIONS[1], A1), (QUESTIONS[2], A2), (QUESTIONS[2], A1)]
    alone = [await text(engine, q, lora) for q, lora in cases]
    together = await asyncio.gather(*(text(engine, q, lora) for q, lora in cases))
    assert list(together) == alone


async def test_unknown_adapter_refused(engine: Engine) -> None:
    with pytest.raises(InvalidRequestError, match="unknown LoRA adapter 'nope'"):
        await text(engine, QUESTIONS[0], lora=(("nope", 1.0),))


async def test_cached_prefix_never_crosses_adapters(adapters: tuple[LoraAdapter, ...]) -> None:
    cache = CacheConfig(block_tokens=16, ram_bytes=1 << 28, min_tokens=16)
    engine = await start(loras=adapters, n_seq_max=1, n_threads=2, embeddings=False, cache=cache)

    async def cached_tokens(lora: tuple) -> tuple[str, int]:
        out, cached = "", -1
        async for _, o in await engine.generate([request(prompt, max_tokens=8, lora=lora)]):
            out += o.text
            if o.finish_reason is not None:
                cached = o.num_cached_tokens
        return out, cached

    try:
        prompt = chat_prompt(engine, " ".join(QUESTIONS * 4))
        cold_two, cached = await cached_tokens(A2)
        assert cached == 0
        assert (await cached_tokens(A1))[1] == 0  # A2's KV is in the slot and the cache
        assert (await cached_tokens(()))[1] == 0  # ... and is not the base model's either
        assert (await cached_tokens((("two", 0.5),)))[1] == 0  # another scale: another set
        warm_two, cached = await cached_tokens(A2)
        assert cached > 0 and warm_two == cold_two  # A2 finds its own, and stays exact
    finally:
        engine.close()


async def test_a_broken_adapter_fails_the_load(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF not really")
    config = EngineConfig(
        default_model_path(), "m", embeddings=False, loras=(LoraAdapter("bad", str(bad)),)
    )
    engine = Engine(config)
    engine.start()
    while engine.state.value == "loading":
        await asyncio.sleep(0.02)
    assert engine.state.value == "failed"
    assert "LoRA adapter 'bad'" in (engine.load_error or "")


async def test_an_adapter_from_the_hub(adapters: tuple[LoraAdapter, ...], tmp_path: Path) -> None:
    from functools import partial

    from server.config.hub import HubSource
    from server.models.hub import fetch
    from tests.helpers.hub_standin import HubFile, StandIn
    from tests.helpers.hub_standin import start as start_hub

    stand_in, server = start_hub(
        StandIn({"kv/one-lora": {"one.gguf": HubFile(Path(adapters[0].path))}})
    )
    try:
        source = HubSource.parse(
            "models[0].loras[0].hf_repo", "kv/one-lora", cache_dir=str(tmp_path)
        )
        hub_one = LoraAdapter(
            "one", "", 0.0, partial(fetch, source, endpoint=stand_in.url, offline=False)
        )
        engine = await start(loras=(hub_one,), n_seq_max=1, n_threads=2, embeddings=False)
        try:
            assert stand_in.downloads == ["one.gguf"]
            local = await start(loras=adapters[:1], n_seq_max=1, n_threads=2, embeddings=False)
            try:
                assert await text(engine, QUESTIONS[0], lora=A1) == await text(
                    local, QUESTIONS[0], lora=A1
                )
            finally:
                local.close()
        finally:
            engine.close()
    finally:
        server.shutdown()
        server.server_close()
