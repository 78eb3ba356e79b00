"""Prefilling a chunk of a prompt that holds image positions.

A llama_batch carries token ids or input embeddings, not both: a chunk that crosses an
image is decoded as its runs, in order, one llama_decode each: text runs as tokens,
image runs as the rows of the image's embeddings (engine/llama/vision.py encodes the image
once and keeps it; this module only feeds the rows). A chunk never ends inside an
image (the scheduler's rule, engine/media.py `whole_image_chunk`), so each image is one
llama_decode, as llama-server decodes it: the rows of a projector that attends both ways
(Gemma 3) see each other. Image ids (< 0) never reach llama_decode as tokens. The
chunk's last row is in the last decode, where the runner samples it as it samples any
prefill chunk.

An image that cannot be encoded (the projector fails: not a llama_decode failure) fails
its own request (`ImageEncodeError`, engine/thread/runner.py and worker.py): the other
chunks of the step go on, and the engine thread with them.
"""

from __future__ import annotations

import logging

from engine.llama import Batch, Context, EmbdBatch, Vision
from engine.media import image_spans
from engine.thread.plan import Chunk

log = logging.getLogger(__name__)


class ImageEncodeError(Exception):
    """An image of the chunk could not be encoded; the message is the request's error."""


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
    last decode): a code other than 0 stops at that run. ImageEncodeError: an image
    could not be encoded (the runs before it are decoded: the caller drops them)."""
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
    for i, (start, stop, image) in enumerate(runs):
        last = i == len(runs) - 1 and chunk.sample
        if image is None:
            batch.clear()
            last_row = batch.add(seq.slot, seq.tokens[start:stop], start, last)
            code = ctx.decode(batch)
        else:
            first, past, _ = spans[image]
            try:
                rows = vision.embeddings(request.media[image], past - first, embd.n_embd)
            except Exception as exc:  # the projector's failure costs this request only
                log.exception("vision: image %d of %s could not be encoded", image,
                              request.request_id)  # fmt: skip
                raise ImageEncodeError(
                    f"image {image} could not be encoded ({type(exc).__name__}: {exc})"
                ) from exc
            embd.fill(seq.slot, rows[start - first : stop - first], start, last)
            last_row = stop - start - 1
            code = ctx.decode_embeddings(embd.struct, causal=not vision.non_causal)
        if code != 0:
            return code, last_row
    return 0, last_row
