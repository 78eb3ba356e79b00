"""Weight and KV options ([engine] flash_attn, type_k/type_v, n_ubatch, n_gpu_layers,
extra_bufts, speculative): accepted values and the combinations refused at start."""

from __future__ import annotations

import pytest

from engine import gpu_offload_supported
from server.config.tree import ConfigError, load_settings


def settings(**env: str) -> object:
    return load_settings(env={f"KVSERVE_ENGINE_{k.upper()}": v for k, v in env.items()})


def test_defaults() -> None:
    e = load_settings(env={}).engine
    assert (e.flash_attn, e.type_k, e.type_v, e.n_ubatch) == (True, "f16", "f16", 0)
    assert (e.n_gpu_layers, e.extra_bufts, e.speculative) == (0, "auto", False)


def test_a_quantized_kv_cache_is_accepted() -> None:
    e = settings(type_k="q8_0", type_v="q8_0").engine  # type: ignore[attr-defined]
    assert (e.type_k, e.type_v) == ("q8_0", "q8_0")


@pytest.mark.parametrize(
    ("env", "key"),
    [
        ({"type_k": "q3_k"}, "engine.type_k"),
        ({"type_v": "int8"}, "engine.type_v"),
        ({"type_v": "q8_0", "flash_attn": "false", "speculative": "false"}, "engine.type_v"),
        ({"flash_attn": "false", "speculative": "true"}, "engine.speculative"),
        ({"n_ubatch": "1024"}, "engine.n_ubatch"),
        ({"n_ubatch": "-1"}, "engine.n_ubatch"),
        ({"n_ubatch": "128", "exact_reuse": "true"}, "engine.n_ubatch"),  # < prefill_chunk
        # exact reuse needs 2-row chunks without flash attention: a 3-token prompt fits whole
        ({"exact_reuse": "true", "flash_attn": "false", "prefill_chunk": "3"}, "engine.prefill_chunk"),
        ({"exact_reuse": "true", "flash_attn": "false", "n_batch": "10"}, "engine.n_batch"),
        ({"extra_bufts": "maybe"}, "engine.extra_bufts"),
        ({"n_gpu_layers": "-2"}, "engine.n_gpu_layers"),
    ],
)
def test_refused_with_the_key_named(env: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError, match=f"^{key}:"):
        settings(**env)


def test_flash_attention_off_is_fine_without_speculation() -> None:
    e = settings(flash_attn="false").engine  # type: ignore[attr-defined]
    assert not e.flash_attn


def test_exact_reuse_without_flash_attention_takes_small_chunks() -> None:
    """The bounds follow engine.scheduler.exact_min_rows: 2-row chunks, not 64 (and a
    block of rows: engine/exact_rules.py exact_min_chunk)."""
    off = {"exact_reuse": "true", "flash_attn": "false"}
    e = settings(**off, prefill_chunk="6", n_batch="14").engine  # type: ignore[attr-defined]
    assert (e.prefill_chunk, e.n_batch) == (6, 14)
    with pytest.raises(ConfigError, match="^engine.prefill_chunk: must be at least 6"):
        settings(**off, prefill_chunk="5", n_batch="512")
    with pytest.raises(ConfigError, match="^engine.prefill_chunk: must be at least 130"):
        settings(exact_reuse="true", prefill_chunk="4", n_batch="512")


@pytest.mark.skipif(gpu_offload_supported(), reason="this build can offload to a GPU")
def test_gpu_layers_on_a_cpu_build_are_refused() -> None:
    with pytest.raises(ConfigError, match="^engine.n_gpu_layers: .*CMAKE_ARGS"):
        settings(n_gpu_layers="99")
