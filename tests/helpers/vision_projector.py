"""A vision projector for the default model, written by the tests (issue 50 item 3).

No vision GGUF can be downloaded here, so the tests write a random-weight one with the
`gguf` package: a LLaVA-style projector (`clip.projector_type = "mlp"`, the simplest
that llama.cpp's clip and libmtmd load), tiny, its output width matched to SmolLM2-135M's
n_embd (576) so it runs with the bundled model:
- a ViT of 2 blocks of width 64 (4 heads, feed-forward 128); LLaVA reads the features of
  the second-to-last block, so one block runs;
- images are resized (padded to a square) to 64x64 and cut into 16x16 patches: every
  image is IMAGE_TOKENS = 16 positions in the prompt;
- the projector: mm.0 (64 -> 128), GELU, mm.2 (128 -> 576).
Random weights are enough: the tests compare warm answers with cold ones and one image's
logits with another's. `png` writes small images without PIL (not in the venv).

Tensor shapes: numpy's are ggml's `ne` reversed (ne [n_in, n_out] is numpy (n_out, n_in)).
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import numpy as np

N_EMBD_TEXT = 576  # SmolLM2-135M's
WIDTH, HEADS, FF, LAYERS = 64, 4, 128, 2
IMAGE_SIZE, PATCH = 64, 16
IMAGE_TOKENS = (IMAGE_SIZE // PATCH) ** 2
PROJECTOR_ROOT = Path.home() / ".cache" / "kvserve" / "vision"  # beside the family models


def projector_path(seed: int = 7) -> Path:
    """The cached projector of this seed, written on first use (atomically: a rename)."""
    path = PROJECTOR_ROOT / f"mmproj-mlp-w{WIDTH}-{IMAGE_SIZE}px-to{N_EMBD_TEXT}-s{seed}.gguf"
    if not path.exists():
        PROJECTOR_ROOT.mkdir(parents=True, exist_ok=True)
        scratch = path.with_suffix(f".{os.getpid()}.tmp")
        write_projector(scratch, seed=seed)
        scratch.replace(path)
    return path


def write_projector(path: Path, *, seed: int, n_embd_text: int = N_EMBD_TEXT) -> Path:
    import gguf

    rng = np.random.default_rng(seed)

    def weights(*shape: int, std: float = 0.1) -> np.ndarray:
        return rng.normal(0, std, shape).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_string("general.name", "kvserve test projector")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_string("clip.projector_type", "mlp")
    writer.add_uint32("clip.vision.embedding_length", WIDTH)
    writer.add_uint32("clip.vision.feed_forward_length", FF)
    writer.add_uint32("clip.vision.block_count", LAYERS)
    writer.add_uint32("clip.vision.projection_dim", n_embd_text)
    writer.add_uint32("clip.vision.attention.head_count", HEADS)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
    writer.add_uint32("clip.vision.image_size", IMAGE_SIZE)
    writer.add_uint32("clip.vision.patch_size", PATCH)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    writer.add_bool("clip.use_gelu", True)
    # the patch embedding: a conv of ne [PATCH, PATCH, 3, WIDTH]
    writer.add_tensor("v.patch_embd.weight", weights(WIDTH, 3, PATCH, PATCH, std=0.05))
    writer.add_tensor("v.patch_embd.bias", weights(WIDTH))
    writer.add_tensor("v.position_embd.weight", weights(IMAGE_TOKENS, WIDTH))
    for il in range(LAYERS):
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            writer.add_tensor(f"v.blk.{il}.{name}.weight", weights(WIDTH, WIDTH))
            writer.add_tensor(f"v.blk.{il}.{name}.bias", weights(WIDTH))
        for name in ("ln1", "ln2"):
            writer.add_tensor(f"v.blk.{il}.{name}.weight", 1 + weights(WIDTH))
            writer.add_tensor(f"v.blk.{il}.{name}.bias", weights(WIDTH))
        writer.add_tensor(f"v.blk.{il}.ffn_up.weight", weights(FF, WIDTH))
        writer.add_tensor(f"v.blk.{il}.ffn_up.bias", weights(FF))
        writer.add_tensor(f"v.blk.{il}.ffn_down.weight", weights(WIDTH, FF))
        writer.add_tensor(f"v.blk.{il}.ffn_down.bias", weights(WIDTH))
    writer.add_tensor("mm.0.weight", weights(2 * WIDTH, WIDTH))
    writer.add_tensor("mm.0.bias", weights(2 * WIDTH))
    writer.add_tensor("mm.2.weight", weights(n_embd_text, 2 * WIDTH))
    writer.add_tensor("mm.2.bias", weights(n_embd_text, std=0.02))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def png(width: int, height: int, seed: int) -> bytes:
    """An RGB PNG of random pixels (a different picture for each seed)."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    rows = b"".join(b"\x00" + pixels[y].tobytes() for y in range(height))  # filter 0 per row

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )
