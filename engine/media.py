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
  still refused (engine/validation.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

# Ids are int32 (the cache's key layout, cache/keys.py): [-2**31, -1].
_ID_SPAN = 2**31


def media_ids(digest: str, num_tokens: int, projector: str = "") -> list[int]:
    """The ids of an image's `num_tokens` positions: all < 0, stable across processes."""
    head = f"{projector}\x00{digest}\x00".encode()
    ids = []
    for position in range(num_tokens):
        h = hashlib.blake2b(head + position.to_bytes(4, "little"), digest_size=4).digest()
        ids.append(-1 - int.from_bytes(h, "little") % _ID_SPAN)
    return ids


def is_media(token: int) -> bool:
    """Whether a prompt id holds an image position (not a vocabulary token)."""
    return token < 0


def media_spans(tokens: Sequence[int]) -> list[tuple[int, int]]:
    """The [start, end) spans of consecutive image ids in `tokens`, in order.

    Two images placed back to back would read as one span here; `tokenize_media` never
    places them so (llama.cpp's chat templates and mtmd put text between images).
    """
    spans: list[tuple[int, int]] = []
    start = -1
    for i, t in enumerate(tokens):
        if t < 0 and start < 0:
            start = i
        elif t >= 0 and start >= 0:
            spans.append((start, i))
            start = -1
    if start >= 0:
        spans.append((start, len(tokens)))
    return spans


def cut_outside_media(tokens: Sequence[int], cut: int) -> int:
    """`cut` (a number of prompt positions reused) moved back to the start of the
    image it falls inside: an image is computed whole or reused whole."""
    if cut <= 0 or cut >= len(tokens) or tokens[cut] >= 0 or tokens[cut - 1] >= 0:
        return cut
    while cut > 0 and tokens[cut - 1] < 0:
        cut -= 1
    return cut
