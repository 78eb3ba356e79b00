"""Images in a prompt: the pseudo token ids that hold an image's positions.

A prompt with images is a list of token ids in which each image's positions hold ids
below zero (real tokens are >= 0). The ids are derived from the image's digest (sha256
of its bytes), the projector's identity and the position inside the image, with a
stable hash, so:
- the same picture at the same place in the same prompt gives the same ids in every
  process: the prefix cache's keys (token tuples, int32 on disk and in Redis) match
  across restarts and replicas;
- two different pictures never share an id sequence (31 bits per position; a false
  match needs every position of the span to collide);
- only `tokenize_media` mints them: a client's token prompt with a negative id is
  still refused (engine/loop/validation.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Media:
    """One image a prompt carries, as the client sent it (PNG, JPEG, ... file bytes)."""

    data: bytes = field(repr=False)
    digest: str  # sha256 hex of `data`: what the prefix cache keys the image's positions by


# Ids are int32 (the cache's key layout, cache/keys.py): [-2**31, -1].
_ID_SPAN = 2**31


def media_ids(digest: str, num_tokens: int, projector: str = "") -> list[int]:
    """The ids of an image's `num_tokens` positions: all < 0, stable across processes."""
    head = _head(digest, projector)
    return [_media_id(head, position) for position in range(num_tokens)]


def _head(digest: str, projector: str) -> bytes:
    return f"{projector}\x00{digest}\x00".encode()


def _media_id(head: bytes, position: int) -> int:
    h = hashlib.blake2b(head + position.to_bytes(4, "little"), digest_size=4).digest()
    return -1 - int.from_bytes(h, "little") % _ID_SPAN


def image_spans(
    tokens: Sequence[int], digests: Sequence[str], projector: str = ""
) -> list[tuple[int, int, int]]:
    """Where each image sits in `tokens`: (start, end, index into `digests`), in order.

    ValueError unless every id < 0 belongs to the ids of the images, in order, each at
    least one position: a prompt holds only the image ids `tokenize_media` minted for
    the images it carries (a client cannot make up a negative id)."""
    spans: list[tuple[int, int, int]] = []
    p, n = 0, len(tokens)
    while p < n:
        if tokens[p] >= 0:
            p += 1
            continue
        index = len(spans)
        if index >= len(digests):
            raise ValueError(f"position {p} holds an image id, and no image is left for it")
        head = _head(digests[index], projector)
        start = p
        while p < n and tokens[p] == _media_id(head, p - start):
            p += 1
        if p == start:
            raise ValueError(f"position {p} holds an id that is not image {index}'s")
        spans.append((start, p, index))
    if len(spans) != len(digests):
        raise ValueError(f"the prompt holds {len(spans)} images and carries {len(digests)}")
    return spans


def is_media(token: int) -> bool:
    """Whether a prompt id holds an image position (not a vocabulary token)."""
    return token < 0


def cut_outside_media(tokens: Sequence[int], cut: int) -> int:
    """`cut` (a number of prompt positions reused) moved back to the start of the
    image it falls inside: an image is computed whole or reused whole. (Two images back
    to back read as one here: the cut goes back to the first one's start.)"""
    if cut <= 0 or cut >= len(tokens) or tokens[cut] >= 0 or tokens[cut - 1] >= 0:
        return cut
    while cut > 0 and tokens[cut - 1] < 0:
        cut -= 1
    return cut


def whole_image_keep(
    tokens: Sequence[int], keep: int, block_floor: Callable[[int], int], floor: int
) -> int:
    """The prefix a start may keep when `keep` would cut an image: moved back to the
    image's start, then to its row block (exact mode), until neither moves it; 0 when
    that is below `floor`, the shortest the slot's state may be cut to."""
    while True:
        cut = block_floor(cut_outside_media(tokens, keep))
        if cut == keep:
            return keep if keep >= floor else 0
        keep = cut


# -- prefill chunks: an image is decoded whole ------------------------------------------
# Some projectors' image rows attend to each other both ways (Gemma 3/4:
# mtmd_decode_use_non_causal): split over two llama_decode calls, the first part would
# never see the second, so llama-server decodes an image in one call. Here too: a chunk
# never ends inside an image (`whole_image_chunk`), and an image too large for one step
# is refused at validation (`image_positions_limit`), where it could never be scheduled.


def image_cut(spans: Sequence[tuple[int, int, int]], end: int) -> tuple[int, int] | None:
    """The image (start, end) a chunk ending before position `end` would cut; None: none."""
    for start, stop, _ in spans:
        if start < end < stop:
            return start, stop
        if start >= end:
            break
    return None


def whole_image_chunk(
    spans: Sequence[tuple[int, int, int]],
    start: int,
    length: int,
    fit: Callable[[int], int],
    widen: Callable[[int], int],
    most: int,
) -> int:
    """`length` rows from `start` (the scheduler's choice, 0: wait), unless they end
    inside an image: then ended before it where the scheduler's rules allow a chunk
    there (`fit(room)`: the longest chunk they allow in `room` rows, 0: none), else
    carried through the image's end (`widen(rows)`: the shortest chunk they allow of at
    least `rows`) if that fits in `most` (the step's room, past the per-chunk cap), else
    0: the sequence waits for a step with room for the whole image."""
    cut = image_cut(spans, start + length) if length > 0 else None
    if cut is None:
        return length
    while cut[0] > start:  # end before the image; each turn shortens the chunk
        shorter = fit(cut[0] - start)
        if shorter == 0:
            break
        before = image_cut(spans, start + shorter)
        if before is None:
            return shorter
        cut = before  # the rules moved the end into an earlier image
    length = widen(cut[1] - start)
    if image_cut(spans, start + length) is not None:
        # The rules rounded the end into a later image (exact reuse: a row block, a
        # full-size chunk): end at this image's end instead. That costs no exactness: a
        # chunk is decoded in runs split at every image boundary (engine/thread/media_prefill.py),
        # so ending it there changes no run; and rounding on from image to image could
        # outgrow every step.
        length = cut[1] - start
    return length if length <= most else 0


def image_positions_limit(
    step_tokens: int, num_slots: int, n_ubatch: int, exact_rows: int, row_block: int
) -> int:
    """The most positions one image may take, so that a step always comes with room for
    it whole: the oldest prefilling sequence's share of a step (decode rows of the other
    slots come first), less what exact reuse may add around the image (the text before
    it that could not be a chunk of its own, a row block, and a full-size last chunk
    after it: up to 2 * (exact_rows + row_block)); and at most one ubatch (`n_ubatch`,
    0: one step), which llama.cpp computes in one pass: split over ubatches, the rows
    of a two-way attending image would again miss each other. `exact_rows` 0: exact
    reuse off."""
    room = step_tokens - (num_slots - 1)
    if exact_rows:
        room -= 2 * (exact_rows + row_block)
    return max(0, min(room, n_ubatch or step_tokens))
