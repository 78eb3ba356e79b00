"""ModelFamily, the load's probe (engine/family.py): kinds of memory, what is refused."""

from __future__ import annotations

from engine.family import ModelFamily, quantization_name


def test_memory_kinds_and_what_follows() -> None:
    cases = {
        ModelFamily("llama"): ("attention", False, False),
        ModelFamily("gemma3", n_swa=512): ("sliding_window", False, True),
        ModelFamily("mamba", recurrent=True): ("recurrent", True, True),
        ModelFamily("lfm2", hybrid=True, n_swa=32): ("hybrid", True, True),
        ModelFamily("qwen35", hybrid=True): ("hybrid", True, True),
    }
    for family, (memory, whole, blob_bound) in cases.items():
        assert (family.memory, family.whole_state, family.blob_bound) == (memory, whole, blob_bound)
        assert family.refusal() is None and family.as_dict()["memory"] == memory


def test_encoder_decoder_and_diffusion_models_are_refused_in_one_line() -> None:
    t5 = ModelFamily("t5", has_encoder=True).refusal()
    dream = ModelFamily("dream", diffusion=True).refusal()
    assert t5 is not None and "encoder-decoder model (t5)" in t5 and "\n" not in t5
    assert dream is not None and "diffusion model (dream)" in dream and "\n" not in dream


def test_quantization_names() -> None:
    assert quantization_name(15) == "Q4_K_M" and quantization_name(3) == "Q4_1"
    assert quantization_name(1024 | 2) == "Q4_0"  # guessed by llama.cpp: still named
    assert quantization_name(999) == "ftype 999"

