"""KV cache options on the real model: a q8_0 cache serves and its saved state is half."""

from __future__ import annotations

import pytest

from engine.llama import Batch, Context, ContextParams, Model
from server.config.tree import default_model_path
from tests.integration.test_engine import chat_prompt, request, run, start

pytestmark = pytest.mark.model


def state_size(model: Model, tokens: list[int], kv_type: str) -> int:
    ctx = Context(model, ContextParams(512, 128, 1, 2, type_k=kv_type, type_v=kv_type))
    try:
        batch = Batch(128)
        batch.add(0, tokens, 0, True)
        assert ctx.decode(batch) == 0
        return len(ctx.get_seq_state(0))
    finally:
        ctx.close()


def test_q8_0_halves_the_saved_state() -> None:
    model = Model(default_model_path())
    try:
        tokens = model.tokenize(
            "The cat sat on the mat. " * 12, add_special=True, parse_special=False
        )
        f16, q8 = state_size(model, tokens, "f16"), state_size(model, tokens, "q8_0")
    finally:
        model.close()
    assert 0.45 < q8 / f16 < 0.6, (f16, q8)


async def test_an_engine_on_a_q8_0_cache_answers() -> None:
    engine = await start(type_k="q8_0", type_v="q8_0", n_seq_max=2, n_threads=2)
    try:
        text, reason, _, count = await run(
            engine, request(chat_prompt(engine, "Name a colour."), max_tokens=8)
        )
        assert text and count > 0 and reason is not None
    finally:
        engine.close()
