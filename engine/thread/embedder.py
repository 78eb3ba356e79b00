"""Embeddings on a second context, one chunk per engine step.

The default model is a causal LM, so an input's token states can be computed chunk by
chunk (the KV cache carries the left context) and mean-pooled by us. That lets a long
input share the engine thread with generation a chunk at a time instead of stalling
every stream for the whole input.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from engine.commands import EmbedJob
from engine.llama import Batch, Context

EMBED_SEQ = 0


class Embedder:
    def __init__(self, ctx: Context, chunk: int):
        self.ctx = ctx
        self.chunk = chunk
        self.batch = Batch(chunk)
        self.jobs: deque[EmbedJob] = deque()

    @property
    def n_ctx(self) -> int:
        return self.ctx.n_ctx

    @property
    def has_work(self) -> bool:
        return bool(self.jobs)

    def step(self) -> None:
        """Compute one chunk of the oldest job; finish inputs and jobs as they complete."""
        job = self.jobs[0]
        if job.cancelled:
            self._end(job, None, None)
            return
        tokens = job.inputs[len(job.results)]
        piece = tokens[job.offset : job.offset + self.chunk]
        self.batch.clear()
        self.batch.add_all_outputs(EMBED_SEQ, piece, job.offset)
        code = self.ctx.decode(self.batch)
        if code != 0:
            self._end(job, None, f"embedding decode failed with code {code}")
            return
        part = self.ctx.embeddings(len(piece)).sum(axis=0, dtype=np.float64)
        job.total = part if job.total is None else job.total + part
        job.offset += len(piece)
        if job.offset < len(tokens):
            return
        mean = job.total / len(tokens)
        norm = float(np.linalg.norm(mean))
        job.results.append((mean / norm if norm > 0 else mean).astype(np.float32))
        job.offset, job.total = 0, None
        self.ctx.remove_seq(EMBED_SEQ)
        if len(job.results) == len(job.inputs):
            self._end(job, job.results, None)

    def _end(self, job: EmbedJob, results: list[np.ndarray] | None, error: str | None) -> None:
        self.jobs.popleft()
        self.ctx.remove_seq(EMBED_SEQ)
        job.on_done(results, error)
