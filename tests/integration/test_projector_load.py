"""A projector made for another model's width (issue 50): the load is refused in one line
naming llama.cpp's reason, the process stays up, and the engine says why."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.engine import Engine
from engine.types import EngineState
from server.config.model_entries import default_model_path
from tests.helpers.vision_projector import N_EMBD_TEXT, write_projector

pytestmark = pytest.mark.model


async def test_a_projector_of_another_width_refuses_the_load(tmp_path: Path) -> None:
    wrong = write_projector(tmp_path / "mmproj-wrong.gguf", seed=3, n_embd_text=512)
    config = dataclasses.replace(
        EngineConfig(default_model_path(), "smol"), n_seq_max=1, mmproj=str(wrong)
    )
    engine = Engine(config)
    engine.start()
    try:
        while engine.state == EngineState.LOADING:
            await asyncio.sleep(0.02)
        assert engine.state == EngineState.FAILED
        assert engine.load_refused  # loading again cannot help: no retry loop
        error = engine.load_error or ""
        assert error.startswith(f"model 'smol' cannot be served: llama.cpp could not load "
                                f"the vision projector at {wrong}")  # fmt: skip
        assert (
            f"mismatch between text model (n_embd = {N_EMBD_TEXT}) and mmproj (n_embd = 512)"
            in error
        )
        assert "\n" not in error
    finally:
        engine.close()
