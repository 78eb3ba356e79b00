"""Exact reuse, measured: how many prompt rows a warm start must compute again so that
its logits equal the cold start's bit for bit, on this model, quantization and CPU.

llama.cpp computes a step's rows with other kernels depending on how many rows of a
sequence the step holds (flash attention's tiled path needs 64; some quantized matmuls
take a vector path for a few rows; which ones differ depends on the weights' type and
the CPU). A fixed rule measured on one model did not hold on another (Gemma 3 Q4_K_M
without flash attention differs up to 7 rows, SmolLM2 Q4_1 at none), so the bound is
measured at load, when exact_reuse is on, on the context the engine will use:

  a random prompt of L tokens in one llama_decode (the cold reference), then for k rows,
  largest first: the prompt's head computed without its last k tokens, and those k
  tokens as one step (what a warm start does); the last row's logits compared.

The bound is the smallest k of CANDIDATES from which every larger candidate matched,
checked once more on a prompt 2 tokens shorter, cut on a row block as placement cuts
(repacked weights compute a chunk's rows four at a time and the rest apart; no bound
holds where that check fails).
A one-row step is never trusted (it takes vector paths that were measured to differ at
long contexts even where short ones agree), and with flash attention nothing under its
tile of 64 rows is tried. The figure is remembered per model file and settings for the
process's life. Engine thread (or the loader) only.
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np

from engine.exact_rules import EXACT_ROW_BLOCK, FLASH_TILE_ROWS
from engine.llama import Batch, Context

log = logging.getLogger("kvserve.engine")

CANDIDATES = (128, 96, 65, 64, 63, 48, 33, 32, 31, 24, 16, 12, 8, 7, 6, 5, 4, 3, 2)
PROBE_TOKENS = 256  # the reference prompt's length (at most n_batch and the context)
PROBE_SEED = 20261202

_memo: dict[tuple[object, ...], int | None] = {}


def exact_rows(ctx: Context, *, flash_attn: bool, whole_state: bool) -> int | None:
    """The fewest rows a warm start must compute again for exact reuse on `ctx`'s model
    (None: no candidate up to CANDIDATES[0] gives the cold logits). Leaves sequence 0 of
    `ctx` empty."""
    path = ctx.model.path
    stat = os.stat(path)
    key = (path, stat.st_size, stat.st_mtime_ns, ctx.params, flash_attn, whole_state)
    if key not in _memo:
        started = time.monotonic()
        _memo[key] = _measure(ctx, flash_attn=flash_attn, whole_state=whole_state)
        log.info(
            "exact reuse on %s: %s rows computed again (measured in %.1f s)",
            os.path.basename(path), _memo[key], time.monotonic() - started,
        )
    return _memo[key]


def _measure(ctx: Context, *, flash_attn: bool, whole_state: bool) -> int | None:
    length = min(PROBE_TOKENS, ctx.params.n_batch, ctx.n_ctx_seq - 1)
    rng = np.random.default_rng(PROBE_SEED)
    # Ids away from the ends of the vocabulary, where control tokens usually sit.
    low, high = min(100, ctx.model.n_vocab // 4), max(1, ctx.model.n_vocab - 100)
    prompt = [int(t) for t in rng.integers(low, max(low + 1, high), length)]
    batch = Batch(length)
    try:
        cold = _run(ctx, batch, prompt, 0, length).copy()
        floor = FLASH_TILE_ROWS if flash_attn else 2
        bound: int | None = None
        for rows in CANDIDATES:
            if rows >= length or rows < floor:
                continue
            if whole_state:  # its state cannot be cut back: the head again, then the rows
                ctx.remove_seq(0)
                _run(ctx, batch, prompt, 0, length - rows)
            else:
                ctx.remove_seq(0, length - rows)
            warm = _run(ctx, batch, prompt, length - rows, length)
            if not np.array_equal(warm, cold):
                break
            bound = rows
        off_block_ok = whole_state or bound is None or _holds_off_a_block(ctx, batch, prompt, bound)
        return bound if off_block_ok else None
    finally:
        ctx.remove_seq(0)


def _holds_off_a_block(ctx: Context, batch: Batch, prompt: list[int], bound: int) -> bool:
    """Whether `bound` also holds for a prompt whose cold last chunk ends off a row block
    (engine/exact_rules.py EXACT_ROW_BLOCK), with the warm start cut on a block as placement
    cuts it: the case a reference prompt of a multiple of 4 tokens cannot show."""
    length = len(prompt) - EXACT_ROW_BLOCK // 2
    start = (length - bound) // EXACT_ROW_BLOCK * EXACT_ROW_BLOCK
    if start <= 0:
        return True
    ctx.remove_seq(0)
    cold = _run(ctx, batch, prompt, 0, length).copy()
    ctx.remove_seq(0, start)
    return bool(np.array_equal(_run(ctx, batch, prompt, start, length), cold))


def _run(ctx: Context, batch: Batch, prompt: list[int], start: int, end: int) -> np.ndarray:
    """Positions start..end of `prompt` on sequence 0 in one step; the last row's logits."""
    batch.clear()
    row = batch.add(0, prompt[start:end], start, logits_last=True)
    code = ctx.decode(batch)
    if code != 0:
        raise RuntimeError(f"llama_decode failed with code {code} while measuring exact reuse")
    return ctx.logits_row(row)
