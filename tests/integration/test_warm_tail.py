"""The warm tail on the real engine: where a padded flash tile pays for any chunk (a CPU
with AMX), a warm start computes the last 64 prompt tokens again, in a decode of its own;
on other CPUs only a warm start of 48-63 new rows is padded so, and a shorter one computes
what is new (at least its last row). The rule is the CPU's, so each is forced here to run
it on any machine (engine/thread/plan.py pad_from)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from engine.engine import Engine
from engine.llama import cpu_has_amx
from tests.integration.test_engine import request, start, system_prompt

pytestmark = pytest.mark.model


async def engine_on(monkeypatch: pytest.MonkeyPatch, amx: bool) -> AsyncIterator[Engine]:
    """An engine loaded as if this CPU had AMX (`amx`) or not: the padding rule is chosen
    at load from the CPU."""
    monkeypatch.setattr("engine.thread.loading.cpu_has_amx", lambda: amx)
    e = await start(exact_reuse=False)
    yield e
    e.close()


@pytest.fixture
async def tiled(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Engine]:
    async for e in engine_on(monkeypatch, amx=True):
        yield e


async def answer(engine: Engine, prompt: tuple[int, ...], max_tokens: int = 12) -> tuple[str, int]:
    text, cached = "", -1
    async for _, out in await engine.generate([request(prompt, max_tokens=max_tokens)]):
        text += out.text
        if out.finish_reason is not None:
            cached = out.num_cached_tokens
    return text, cached


def long_prompt(engine: Engine, question: str) -> tuple[int, ...]:
    return system_prompt(engine, "Answer in one short sentence, please. " * 20 + question)


@pytest.fixture
async def row_by_row(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Engine]:
    async for e in engine_on(monkeypatch, amx=False):
        yield e


async def test_the_default_tail_follows_the_cpu() -> None:
    engine = await start(exact_reuse=False)
    try:
        rows, why = engine.info.warm_tail
        assert rows == 64 and ("with AMX" if cpu_has_amx() else "without AMX") in why
    finally:
        engine.close()


async def test_without_amx_only_a_warm_start_near_a_tile_is_padded(row_by_row: Engine) -> None:
    prompt = long_prompt(row_by_row, "What is the capital of France?")
    await answer(row_by_row, prompt)
    _, cached = await answer(row_by_row, prompt)
    assert cached == len(prompt) - 1  # one new row: not padded
    words = row_by_row.tokenize(" and then, please, tell me" * 30, add_special=False)
    grown = prompt + tuple(words[:55])
    text, cached = await answer(row_by_row, grown)
    assert text and cached == len(grown) - 64  # 55 new rows: a whole tile


async def test_a_repeated_long_prompt_computes_a_tile_again(tiled: Engine) -> None:
    assert tiled.info.warm_tail[0] == 64
    prompt = long_prompt(tiled, "What is the capital of France?")
    assert len(prompt) >= 128
    first, cached = await answer(tiled, prompt)
    assert cached == 0 and first
    again, cached = await answer(tiled, prompt)
    assert cached == len(prompt) - 64 and again
    short = system_prompt(tiled, "Name a painter.")  # under two tiles: all but its last
    await answer(tiled, short)
    _, cached = await answer(tiled, short)
    assert cached == len(short) - 1


async def test_a_grown_conversation_reuses_its_turn_less_the_tile(tiled: Engine) -> None:
    prompt = long_prompt(tiled, "Why is the sky blue?")
    reply, _ = await answer(tiled, prompt, max_tokens=16)
    grown = prompt + tuple(tiled.tokenize(reply + " And why is it red at dusk?", add_special=False))
    _, cached = await answer(tiled, grown)
    # The first turn's prompt is in the slot (its reply too, up to the tokens the
    # tokenizer merged differently); the tile is cut from what the second turn holds.
    assert len(prompt) - 64 <= cached <= len(grown) - 64


async def test_warm_starts_side_by_side_on_all_slots(tiled: Engine) -> None:
    questions = ["capital of Italy?", "a prime number?", "a colour?", "a river?"]
    prompts = [long_prompt(tiled, q) for q in questions]
    await asyncio.gather(*(answer(tiled, p) for p in prompts))
    results = await asyncio.gather(*(answer(tiled, p) for p in prompts))
    for prompt, (text, cached) in zip(prompts, results, strict=True):
        assert text and cached == len(prompt) - 64
