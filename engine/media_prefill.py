"""Prefilling a chunk of a prompt that holds image positions.

A llama_batch carries token ids or input embeddings, not both: a chunk that crosses an
image is decoded as its runs, in order, one llama_decode each: text runs as tokens,
image runs as the rows of the image's embeddings (engine/vision.py encodes the image
once and keeps it; this module only feeds the rows). Image ids (< 0) never reach
llama_decode as tokens. The chunk's last row is in the last decode, where the runner
samples it as it samples any prefill chunk.
"""

from __future__ import annotations

import ctypes

import llama_cpp as C
import numpy as np

from engine.llama.context import Batch, Context
from engine.media import image_spans
from engine.plan import Chunk
from engine.vision import Vision


class EmbdBatch:
    """A `llama_batch` of input embeddings for one sequence (rows float32, n_embd wide)."""

    def __init__(self, capacity: int, n_embd: int):
        self.capacity, self.n_embd = capacity, n_embd
        self.embd = np.zeros((capacity, n_embd), dtype=np.float32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.n_seq_id = np.ones(capacity, dtype=np.int32)
        self.seq_ids = np.zeros(capacity, dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        i32p = ctypes.POINTER(ctypes.c_int32)
        self._seq_ptrs = (i32p * capacity)()
        for i in range(capacity):
            self._seq_ptrs[i] = ctypes.cast(self.seq_ids.ctypes.data + 4 * i, i32p)
        self.struct = C.llama_batch(
            n_tokens=0,
            token=None,
            embd=self.embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
            pos=self.pos.ctypes.data_as(i32p),
            n_seq_id=self.n_seq_id.ctypes.data_as(i32p),
            seq_id=ctypes.cast(self._seq_ptrs, ctypes.POINTER(i32p)),
            logits=self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)),
        )

    def fill(self, seq_id: int, rows: np.ndarray, start_pos: int, logits_last: bool) -> None:
        n = len(rows)
        if n > self.capacity:
            raise ValueError(f"batch overflow: {n} > {self.capacity}")
        self.embd[:n] = rows
        self.pos[:n] = np.arange(start_pos, start_pos + n, dtype=np.int32)
        self.seq_ids[:n] = seq_id
        self.logits[:n] = 0
        self.logits[n - 1] = int(logits_last)
        self.struct.n_tokens = n


def has_media(chunk: Chunk) -> bool:
    """Whether the chunk's rows cross an image (a text-only request costs one test)."""
    seq = chunk.seq
    if not seq.request.media or chunk.draft:
        return False
    return min(seq.tokens[chunk.start : chunk.start + chunk.length]) < 0


def prefill_media_chunk(
    ctx: Context, vision: Vision, batch: Batch, embd: EmbdBatch, chunk: Chunk
) -> tuple[int, int]:
    """Decode the chunk run by run; (the llama_decode code, the last row's index in the
    last decode): a code other than 0 stops at that run."""
    seq = chunk.seq
    assert seq.slot is not None
    request = seq.request
    end = chunk.start + chunk.length
    digests = [m.digest for m in request.media]
    spans = image_spans(seq.tokens, digests, vision.identity)
    runs: list[tuple[int, int, int | None]] = []  # start, end, image index (None: text)
    at = chunk.start
    for start, stop, index in spans:
        if stop <= at or start >= end:
            continue
        if start > at:
            runs.append((at, start, None))
        runs.append((max(start, at), min(stop, end), index))
        at = min(stop, end)
    if at < end:
        runs.append((at, end, None))
    last_row = 0
    for i, (start, stop, index) in enumerate(runs):
        last = i == len(runs) - 1 and chunk.sample
        if index is None:
            batch.clear()
            last_row = batch.add(seq.slot, seq.tokens[start:stop], start, last)
            code = ctx.decode(batch)
        else:
            first, past, _ = spans[index]
            rows = vision.embeddings(request.media[index], past - first, embd.n_embd)
            embd.fill(seq.slot, rows[start - first : stop - first], start, last)
            last_row = stop - start - 1
            code = ctx.decode_embeddings(embd.struct, causal=not vision.non_causal)
        if code != 0:
            return code, last_row
    return 0, last_row
