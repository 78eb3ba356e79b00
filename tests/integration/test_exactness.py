"""The exact-reuse probe at load (engine/thread/exactness.py) on the real models: it finds a
bound on each, checked on a prompt whose cold last chunk ends off a row block too, and
a model where no bound holds is refused at load, naming it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import engine.thread.exactness as exactness
from engine.engine import Engine, EngineConfig
from engine.llama import Context, ContextParams, Model
from server.config.tree import default_model_path

pytestmark = pytest.mark.model


@pytest.mark.parametrize("flash_attn", [True, False])
def test_a_bound_holds_on_both_models(gemma3_270m: Path, flash_attn: bool) -> None:
    for path in (default_model_path(), str(gemma3_270m)):
        model = Model(path)
        ctx = Context(model, ContextParams(2048, 512, 2, 2, flash_attn=flash_attn))
        try:
            rows = exactness._measure(ctx, flash_attn=flash_attn, whole_state=False)
            assert rows is not None and rows >= (64 if flash_attn else 2), (path, rows)
            assert ctx.seq_pos_max(0) < 0  # the probe leaves its sequence empty
        finally:
            ctx.close()
            model.close()


async def test_where_the_off_block_check_fails_exact_reuse_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(exactness, "_holds_off_a_block", lambda *args: False)
    monkeypatch.setattr(exactness, "_memo", {})
    config = EngineConfig(default_model_path(), "smol", exact_reuse=True, embeddings=False)
    engine = Engine(config)
    engine.start()
    try:
        while engine.state.value == "loading":
            await asyncio.sleep(0.02)
        assert not engine.ready
        assert "no recompute of up to 128 prompt rows" in (engine.load_error or "")
        assert "model 'smol'" in (engine.load_error or "")
    finally:
        engine.close()
