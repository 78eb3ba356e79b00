"""Executes one scheduled step: fill the batch, decode once, sample each finished chunk."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.llama import Batch, Context, EmbdBatch, Vision
from engine.sequence import Sequence
from engine.thread.media_prefill import ImageEncodeError, has_media, prefill_media_chunk
from engine.thread.scheduler import Chunk
from engine.types import TokenLogprob, TopLogprob


class DecodeError(Exception):
    def __init__(self, code: int):
        reason = {
            1: "no KV cache slot for the batch",
            2: "decode aborted",
            -1: "invalid input batch",
        }.get(code, "internal llama.cpp error")
        super().__init__(f"llama_decode failed with code {code} ({reason})")
        self.code = code


@dataclass(slots=True)
class Sampled:
    seq: Sequence
    token: int | None  # None: the grammar admits nothing more (the sequence ends)
    logprob: TokenLogprob | None
    # Sampled from the row of an accepted draft token: that token's KV is now computed.
    after_draft: bool = False
    # The grammar constrains what follows (a lazy one has triggered): nothing is forced.
    grammar_on: bool = False


@dataclass(slots=True)
class StepResult:
    sampled: list[Sampled]  # a sequence's tokens together and in order
    scored: list[tuple[Sequence, list[TokenLogprob]]]  # prompt log-probabilities
    drafts: list[tuple[Sequence, int, int]] = field(default_factory=list)  # drafted, accepted
    failed: list[tuple[Chunk, str]] = field(default_factory=list)  # an image not encoded: error


def token_logprob(logits: np.ndarray, token: int, top: int) -> TokenLogprob:
    """Log-probability of `token` and the `top` most likely tokens under the raw
    distribution of the model (before temperature, penalties or grammar)."""
    peak = float(logits.max())
    log_norm = peak + float(np.log(np.exp(logits - peak, dtype=np.float32).sum(dtype=np.float64)))
    alternatives: tuple[TopLogprob, ...] = ()
    if top > 0:
        best = np.argpartition(logits, -top)[-top:]
        best = best[np.argsort(-logits[best], kind="stable")]
        alternatives = tuple(TopLogprob(int(t), float(logits[t]) - log_norm) for t in best)
    return TokenLogprob(token, float(logits[token]) - log_norm, alternatives)


class Runner:
    """The model runner: computes what the scheduler decided, decides nothing."""

    def __init__(
        self, ctx: Context, capacity: int, *, solo_rows: int = 0, vision: Vision | None = None
    ):
        self.ctx = ctx
        self.batch = Batch(capacity)
        self.solo_rows = solo_rows  # chunks of this many rows get their own decode; 0: none
        self.vision = vision  # the model's projector: prompts with images (engine/llama/vision.py)
        self._embd: EmbdBatch | None = None  # made by the first chunk crossing an image

    def run(self, chunks: list[Chunk]) -> StepResult:
        """Compute the step: one llama_decode, or (solo_rows) one for the decode rows and
        short chunks together and one for each chunk of solo_rows+ rows.

        Why split (SchedulerConfig.solo_rows, exact reuse): with a KV stream per sequence,
        llama.cpp cuts a batch into ubatches holding the same number of rows of each
        sequence, so a prompt chunk sharing a batch with decode rows is computed partly
        in one-row ubatches, with other kernels than the same chunk alone (exact_min_rows
        in engine/exact_rules.py). Alone in its
        decode, a chunk is one ubatch, exactly as a cold prefill computes it. Shorter
        chunks are computed with the small-step kernels either way.

        A prompt chunk crossing an image is decoded on its own, run by run
        (engine/thread/media_prefill.py), after the rest."""
        media = [c for c in chunks if has_media(c)] if self.vision is not None else []
        if media:
            chunks = [c for c in chunks if all(c is not m for m in media)]
        result = self._run_all(chunks)
        for chunk in media:
            self._run_media(chunk, result)
        return result

    def _run_all(self, chunks: list[Chunk]) -> StepResult:
        if not self.solo_rows:
            return self._run(chunks)
        result = self._run([c for c in chunks if c.length < self.solo_rows])
        for chunk in chunks:
            if chunk.length >= self.solo_rows:
                more = self._run([chunk])
                result.sampled += more.sampled
                result.scored += more.scored
                result.drafts += more.drafts
        return result

    def _run(self, chunks: list[Chunk]) -> StepResult:
        if not chunks:
            return StepResult([], [])
        batch = self.batch
        batch.clear()
        to_sample: list[tuple[Chunk, int]] = []
        to_score: list[tuple[Sequence, int, int, int]] = []  # seq, first row, position, count
        for chunk in chunks:
            seq = chunk.seq
            assert seq.slot is not None
            end = chunk.start + chunk.length
            if chunk.draft:  # the pending token, then the guesses: logits at every row
                row = batch.add(seq.slot, (seq.tokens[-1], *chunk.draft), chunk.start, True)
                batch.logits[row - len(chunk.draft) : row] = 1
            else:
                row = batch.add(seq.slot, seq.tokens[chunk.start : end], chunk.start, chunk.sample)
            if chunk.sample:
                to_sample.append((chunk, row))
            # Rows at positions p < n_prompt - 1 predict prompt token p + 1; each
            # position is scored once (a preempted sequence is prefilled again).
            first = max(chunk.start, seq.num_scored)
            count = min(end, seq.num_prompt_tokens - 1) - first
            if seq.request.prompt_logprobs is not None and count > 0:
                first_row = row - (end - 1 - first)
                batch.logits[first_row : first_row + count] = 1
                to_score.append((seq, first_row, first, count))
        code = self.ctx.decode(batch)
        if code != 0:
            raise DecodeError(code)
        scored = []
        for seq, first_row, first, count in to_score:
            k = seq.request.prompt_logprobs or 0
            rows = range(first_row, first_row + count)
            targets = seq.tokens[first + 1 : first + 1 + count]
            scored.append(
                (
                    seq,
                    [
                        token_logprob(self.ctx.logits_row(r), t, k)
                        for r, t in zip(rows, targets, strict=True)
                    ],
                )
            )
        result = StepResult([], scored)
        for chunk, row in to_sample:
            self._sample(chunk, row - len(chunk.draft), result)
        return result

    def _run_media(self, chunk: Chunk, result: StepResult) -> None:
        vision = self.vision
        assert vision is not None
        if self._embd is None:
            self._embd = EmbdBatch(self.batch.capacity, self.ctx.model.n_embd)
        try:
            code, row = prefill_media_chunk(self.ctx, vision, self.batch, self._embd, chunk)
        except ImageEncodeError as exc:  # its request fails; the step's others go on
            result.failed.append((chunk, str(exc)))
            return
        if code != 0:
            raise DecodeError(code)
        if chunk.sample:
            self._sample(chunk, row, result)

    def _sample(self, chunk: Chunk, first_row: int, result: StepResult) -> None:
        """Sample the chunk's rows in order while the sampler agrees with the draft:
        each kept token is the one plain decoding would have sampled, since the row it
        comes from saw exactly the tokens plain decoding would have fed. (The worker
        drops the KV of the guesses after the first disagreement.)"""
        seq, draft = chunk.seq, chunk.draft
        assert seq.sampler is not None
        top = seq.request.logprobs
        accepted = 0
        while True:
            row = first_row + accepted
            token = seq.sampler.sample(self.ctx, row)
            logprob = None
            if top is not None and token is not None:
                logprob = token_logprob(self.ctx.logits_row(row), token, top)
            result.sampled.append(
                Sampled(seq, token, logprob, accepted > 0, seq.sampler.constraining)
            )
            # None: the grammar admits nothing more, and the sequence ends here.
            if token is None or accepted == len(draft) or token != draft[accepted]:
                break
            accepted += 1
        if draft:
            result.drafts.append((seq, len(draft), accepted))
