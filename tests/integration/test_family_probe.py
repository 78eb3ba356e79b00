"""The family probe at load (issue 27): what llama.cpp says of each model family, in the
engine's ModelInfo and through the server; diffusion models refused at load with one
line (a process exits 2; an on-demand load answers 400)."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.engine import Engine
from tests.helpers.family_models import FamilyModel
from tests.kvserve_process import free_port

pytestmark = pytest.mark.model

# Memory kind as engine/family.py names it, per tests/helpers/family_models.py's kind.
KINDS = {"attention": "attention", "sliding-window": "sliding_window",
         "recurrent": "recurrent", "hybrid": "hybrid"}  # fmt: skip


async def loaded(path: Path, **overrides: object) -> Engine:
    config = dataclasses.replace(EngineConfig(str(path), path.stem), n_ctx=512,
                                 embeddings=False, n_threads=2, **overrides)  # fmt: skip
    engine = Engine(config)
    engine.start()
    while engine.state.value == "loading":
        await asyncio.sleep(0.02)
    return engine


async def test_the_probe_names_each_familys_memory(family_models: dict[str, FamilyModel]) -> None:
    for arch, model in family_models.items():
        engine = await loaded(model.path, n_seq_max=1)
        try:
            assert engine.ready, engine.load_error
            family = engine.info.family
            assert family is not None and family.architecture.startswith(arch.split("-")[0])
            assert family.memory == KINDS[model.memory], arch
            assert (family.n_swa > 0) == (model.memory == "sliding-window" or arch == "lfm2")
            assert family.whole_state == (model.memory in ("recurrent", "hybrid"))
            assert family.n_layer > 0 and family.n_params > 0 and family.quantization
            # Speculation drops rejected drafts' KV: refused where the state is whole.
            assert engine.info.speculative_ok == (not family.whole_state)
        finally:
            engine.close()


async def test_gemma3_270m_is_probed_as_a_sliding_window_model(gemma3_270m: Path) -> None:
    engine = await loaded(gemma3_270m, n_seq_max=1)
    try:
        family = engine.info.family
        assert family is not None
        assert (family.architecture, family.memory, family.n_swa) == ("gemma3", "sliding_window", 512)
        assert (family.quantization, family.n_ctx_train, family.n_layer) == ("Q4_K_M", 32768, 18)
    finally:
        engine.close()


async def test_a_diffusion_model_is_refused_at_load_with_one_line(
    refused_models: dict[str, FamilyModel],
) -> None:
    for model in refused_models.values():
        engine = await loaded(model.path)
        try:
            assert engine.state.value == "failed" and engine.load_refused
            assert engine.load_error is not None and "diffusion model" in engine.load_error
            assert "\n" not in engine.load_error
        finally:
            engine.close()


def test_a_server_started_on_a_diffusion_model_exits_2(
    refused_models: dict[str, FamilyModel], tmp_path: Path
) -> None:
    path = refused_models["dream"].path
    proc = subprocess.run(
        [sys.executable, "-m", "server", "--port", str(free_port()), "--model", str(path)],
        capture_output=True, text=True, timeout=120,
        env={"XDG_CACHE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("kvserve: ")]
    assert len(lines) == 1 and "is a diffusion model (dream)" in lines[0], proc.stderr[-2000:]
