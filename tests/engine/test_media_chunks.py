"""An image is never split across prefill chunks (engine/media.py `whole_image_chunk`,
the scheduler's `_chunk_length`): a chunk ends before an image, or takes it whole past
prefill_chunk; exact reuse's block rules still hold; too large an image is refused."""

from __future__ import annotations

import itertools
import random

import pytest

from engine.detokenizer import IncrementalDetokenizer
from engine.exact_rules import exact_min_rows
from engine.loop.validation import validate
from engine.media import Media, image_positions_limit, image_spans, media_ids
from engine.sequence import Sequence
from engine.thread.scheduler import Scheduler, SchedulerConfig
from engine.types import GenerateRequest, InvalidRequestError, ModelInfo
from tests.engine.test_scheduler import apply, seq_of

PROJECTOR = "test-projector"


def image(n: int) -> Media:
    return Media(bytes([n % 256]) * 8, f"{n:064x}")


def prompt_with(
    parts: list[int | Media], sizes: dict[str, int]
) -> tuple[list[int], tuple[Media, ...]]:
    """Text tokens (ints) and images (taking sizes[digest] positions) in order."""
    tokens: list[int] = []
    media: list[Media] = []
    for part in parts:
        if isinstance(part, Media):
            tokens += media_ids(part.digest, sizes[part.digest], PROJECTOR)
            media.append(part)
        else:
            tokens.append(3 + len(tokens) % 40)
    return tokens, tuple(media)


def text(n: int) -> list[int | Media]:
    return list(range(n))


def seq_with(name: str, tokens: list[int], media: tuple[Media, ...]) -> Sequence:
    request = GenerateRequest(name, tuple(tokens), media=media)
    return Sequence(request, None, IncrementalDetokenizer([b""]), None)


def chunks_of(s: Scheduler, target: Sequence, max_steps: int = 400) -> list[tuple[int, int]]:
    """(start, length) of each prefill chunk of `target` until it samples."""
    out = []
    for _ in range(max_steps):
        for name, start, length, _sample in apply(s):
            if name == target.request_id and start < target.num_prompt_tokens:
                out.append((start, length))
        if target.num_output_tokens >= 1:
            return out
    raise AssertionError(f"{target.request_id} was not prefilled in {max_steps} steps: {out}")


def assert_no_image_cut(
    chunks: list[tuple[int, int]], tokens: list[int], media: tuple[Media, ...]
) -> None:
    spans = image_spans(tokens, [m.digest for m in media], PROJECTOR)
    for start, length in chunks:
        for first, stop, index in spans:
            assert not first < start + length < stop, f"chunk {start}+{length} cuts image {index}"
            assert not first < start < stop, f"chunk {start}+{length} starts inside image {index}"


def test_a_chunk_ends_before_an_image_it_would_cut() -> None:
    a = image(1)
    tokens, media = prompt_with([*text(20), a, *text(80)], {a.digest: 100})
    s = Scheduler(SchedulerConfig(2, 2000, 1000, 512, 32, exact=False, projector=PROJECTOR))
    target = seq_with("t", tokens, media)
    s.add(target)
    chunks = chunks_of(s, target)
    # 0+20 stops at the image (not 0+32), then the image whole (100 > prefill_chunk 32)
    assert chunks[:2] == [(0, 20), (20, 100)]
    assert sum(n for _, n in chunks) == len(tokens)
    assert all(n <= 32 for _, n in chunks[2:])


def test_a_chunk_at_an_image_takes_it_whole_in_exact_mode() -> None:
    a, b = image(1), image(2)
    # exact, 64 rows: the 10 text rows before image `a` cannot be a chunk of their own
    tokens, media = prompt_with([*text(10), a, b, *text(150)], {a.digest: 200, b.digest: 40})
    config = SchedulerConfig(2, 4000, 2000, 400, 130, exact=True, exact_min_rows=64,
                             projector=PROJECTOR)  # fmt: skip
    s = Scheduler(config)
    target = seq_with("t", tokens, media)
    s.add(target)
    chunks = chunks_of(s, target)
    assert_no_image_cut(chunks, tokens, media)
    # through a's end (210), past prefill_chunk, within the step; rounded up to the row
    # block (212) it would cut b, so it ends at a's end. Then b and text up to a row
    # block (336), leaving a full-size last chunk.
    assert chunks == [(0, 210), (210, 126), (336, 64)]


def test_an_image_waits_for_a_step_with_room_for_it_whole() -> None:
    a = image(1)
    tokens, media = prompt_with([a, *text(10)], {a.digest: 60})
    s = Scheduler(SchedulerConfig(3, 3000, 1000, 64, 16, exact=False, projector=PROJECTOR))
    first = seq_of("first", list(range(3, 39)))  # 36 tokens: 16 per step
    s.add(first)
    target = seq_with("t", tokens, media)
    s.add(target)
    plan = apply(s)
    # first takes 16 of 64 rows; the image's 60 do not fit in the 48 left: it waits
    assert plan == [("first", 0, 16, False)]
    apply(s)  # first: 16 more, the image still waits
    plan = apply(s)  # first's last 4 rows, and the image whole beside them
    assert ("t", 0, 60, False) in plan
    assert target.num_computed == 60


MODES = ((False, 64), (True, exact_min_rows(True)), (True, exact_min_rows(False)))


@pytest.mark.parametrize("seed", range(200))
def test_no_chunk_ever_cuts_an_image(seed: int) -> None:
    """Random prompts (images of 1..limit positions, back to back or apart) under random
    settings, while the other slots decode: every chunk ends outside every image, exact
    reuse's rules hold, and the prompt is prefilled."""
    rng = random.Random(seed)
    slots = rng.choice((1, 2, 3))
    exact, rows = rng.choice(MODES)
    step = rng.choice((200, 300, 512))
    chunk = rng.choice((130, 131, 200, 256)) if exact else rng.choice((1, 7, 32, 64, 256))
    config = SchedulerConfig(slots, 4096 * slots, 4096, step, chunk, exact=exact,
                             exact_min_rows=rows, projector=PROJECTOR)  # fmt: skip
    limit = image_positions_limit(step, slots, 0, rows if exact else 0, config.row_block)
    parts: list[int | Media] = []
    sizes: dict[str, int] = {}
    for i in range(rng.randint(1, 4)):
        parts += text(rng.choice((0, 0, 1, 3, 10, 63, 64, 65, 130)))
        pic = image(seed * 10 + i)
        sizes[pic.digest] = rng.randint(1, limit)
        parts.append(pic)
    parts += text(rng.choice((0, 1, 5, 64, 100)))
    tokens, media = prompt_with(parts, sizes)
    s = Scheduler(config)
    for i in range(slots - 1):
        s.add(seq_of(f"busy{i}", [5, 6]))
    apply(s)
    target = seq_with("t", tokens, media)
    s.add(target)
    chunks = chunks_of(s, target)
    assert_no_image_cut(chunks, tokens, media)
    assert sum(n for _, n in chunks) == len(tokens)
    if exact and len(tokens) >= rows:
        # A chunk ends on a row block, at the prompt's end, or at an image's boundary
        # (where its rows are split into runs anyway); it is full-size unless it ends
        # at an image boundary or holds the rest of a prompt that began there.
        spans = image_spans(tokens, [m.digest for m in media], PROJECTOR)
        edges = {e for first, stop, _ in spans for e in (first, stop)}
        for start, n in chunks:
            end = start + n
            assert end % config.row_block == 0 or end == len(tokens) or end in edges
            assert n >= rows or end in edges or start in edges, (start, n)


def test_the_limit_leaves_room_for_the_decode_rows_the_exact_rows_and_one_ubatch() -> None:
    assert image_positions_limit(512, 8, 0, 0, 1) == 505
    assert image_positions_limit(512, 8, 0, 64, 4) == 505 - 136
    assert image_positions_limit(512, 8, 256, 0, 1) == 256  # one ubatch
    assert image_positions_limit(512, 1, 0, 2, 4) == 500


def test_an_image_larger_than_a_step_is_refused_naming_it() -> None:
    info = ModelInfo("m", "/m.gguf", 4096, 4096, 100, 8, 4, None, "", "", False,
                     vision=True, max_image_positions=300)  # fmt: skip
    a, b = image(1), image(2)
    tokens, media = prompt_with([*text(5), a, *text(2), b], {a.digest: 300, b.digest: 301})
    with pytest.raises(InvalidRequestError) as err:
        validate(GenerateRequest("r", tuple(tokens), media=media), info, PROJECTOR)
    assert err.value.param == "image 1"
    assert "301 positions" in str(err.value) and "300" in str(err.value)
    validate(GenerateRequest("ok", tuple(tokens[: 5 + 300 + 2]), media=media[:1]), info, PROJECTOR)


def test_whole_image_chunk_units() -> None:
    from engine.media import whole_image_chunk

    spans = [(10, 20, 0), (20, 30, 1), (40, 50, 2)]

    def plain(rows: int) -> int:
        return rows

    # no image cut: unchanged
    assert whole_image_chunk(spans, 0, 10, plain, plain, 100) == 10
    assert whole_image_chunk(spans, 0, 35, plain, plain, 100) == 35
    # cuts image 0: ends at its start
    assert whole_image_chunk(spans, 0, 15, plain, plain, 100) == 10
    # starts at image 0, cuts image 1 (back to back): ends between them
    assert whole_image_chunk(spans, 10, 15, plain, plain, 100) == 10
    # starts at image 0 and would cut it: the whole image, not past `most`
    assert whole_image_chunk(spans, 10, 5, plain, plain, 100) == 10
    assert whole_image_chunk(spans, 10, 5, plain, plain, 9) == 0
    # nothing fits before the image (fit says 0): carried through it
    assert whole_image_chunk(spans, 0, 15, lambda r: 0, plain, 100) == 20
    # rounded up into the next image: ends at this image's end instead
    assert whole_image_chunk(spans, 0, 15, lambda r: 0, lambda r: r + 2, 100) == 20
    # rounded up into text: kept
    assert whole_image_chunk(spans, 20, 5, lambda r: 0, lambda r: r + 2, 100) == 12
    for start, length in itertools.product(range(0, 50), range(1, 60)):
        if any(a < start < b for a, b, _ in spans):
            continue
        got = whole_image_chunk(spans, start, length, plain, plain, 1000)
        assert not any(a < start + got < b for a, b, _ in spans)
