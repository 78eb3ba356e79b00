"""Repetition penalties on the real model (regression: the penalties sampler was built
with four arguments where llama.cpp's takes five, so every request that set one got a
500)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from engine.engine import Engine, EngineConfig
from engine.types import GenerateRequest, SamplingParams
from server.config.tree import default_model_path

pytestmark = pytest.mark.model

PROMPT = (
    # The greedy answer depends on the CPU's kernels: "Repeat after me: la la ..." was
    # answered with "la"s on an Intel AMX machine and with prose on an AMD EPYC; this
    # prompt gets a long run of "la" on the EPYC (CI's machine).
    "<|im_start|>user\nSay 'la' ten times: la la la la la la la la la la<|im_end|>\n"
    "<|im_start|>assistant\n"
)


async def greedy_text(engine: Engine, prompt: tuple[int, ...], **penalties: float) -> str:
    sampling = SamplingParams(temperature=0.0, repeat_last_n=64, **penalties)  # type: ignore[arg-type]
    generation = await engine.generate(
        [GenerateRequest(uuid.uuid4().hex, prompt, sampling=sampling, max_tokens=24)]
    )
    text = ""
    async with generation:
        async for _, out in generation:
            text += out.text
    return text


async def test_penalties_apply_and_change_greedy_output() -> None:
    # one thread: cheaper on a busy 2-core machine (see tests/reliability/conftest.py)
    config = EngineConfig(default_model_path(), "smol", n_seq_max=1, n_ctx=256, n_threads=1)
    engine = Engine(config)
    engine.start()
    try:
        while engine.state.value == "loading":
            await asyncio.sleep(0.02)
        assert engine.ready, engine.load_error
        prompt = tuple(engine.tokenize(PROMPT, add_special=False, parse_special=True))
        plain = await greedy_text(engine, prompt)
        assert plain.count("la") >= 4  # the model repeats, as asked
        penalised = {
            name: await greedy_text(engine, prompt, **{name: value})
            for name, value in (
                ("frequency_penalty", 2.0),
                ("presence_penalty", 2.0),
                ("repeat_penalty", 3.0),
            )
        }
        for name, text in penalised.items():
            assert text != plain, name  # the penalty reached the sampler
        assert penalised["frequency_penalty"].count("la") < plain.count("la")
    finally:
        engine.close()
