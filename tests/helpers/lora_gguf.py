"""LoRA adapter GGUFs for the default model, written by the tests (the `gguf` package).

Small random A/B matrices for the attention projections of every layer; the metadata
llama.cpp checks (general.type=adapter, adapter.type=lora, adapter.lora.alpha, and the
base model's architecture)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# SmolLM2-135M: 30 layers, n_embd 576, K/V projections 576 -> 192.
N_LAYERS = 30
N_EMBD = 576
OUT = {"attn_q": 576, "attn_k": 192, "attn_v": 192}


def write_lora(
    path: Path, *, seed: int, rank: int = 8, alpha: float = 16.0, std: float = 0.1
) -> Path:
    import gguf

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    for layer in range(N_LAYERS):
        for name, n_out in OUT.items():
            # numpy shapes are ggml's reversed: A is ne [n_in, r], B is ne [r, n_out].
            a = rng.normal(0, std, (rank, N_EMBD)).astype(np.float32)
            b = rng.normal(0, std, (n_out, rank)).astype(np.float32)
            writer.add_tensor(f"blk.{layer}.{name}.weight.lora_a", a)
            writer.add_tensor(f"blk.{layer}.{name}.weight.lora_b", b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
