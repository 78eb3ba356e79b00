"""Images in the engine (issue 50): the default model with a projector the tests write
(tests/helpers/vision_projector.py), through libmtmd.

The prefix cache keys an image's positions by its digest (engine/media.py): the same
picture at the same place is reused, another never is, on a slot, in RAM (one slot, which
a text prompt takes over), on disk after a restart, and never across tenants (salts). The
shared tier, sessions and forks: tests/integration/test_media_tiers.py."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cache import CacheConfig
from engine.engine import Engine
from engine.media import image_spans
from engine.types import GenerateRequest, InvalidRequestError, Media, TokenLogprob
from tests.helpers.vision_projector import IMAGE_TOKENS, png, projector_path
from tests.integration.test_engine import request, start

pytestmark = pytest.mark.model

MARK = "<__media__>"


def image(seed: int, size: int = 40) -> Media:
    data = png(size, size, seed)
    return Media(data, hashlib.sha256(data).hexdigest())


# Long enough that turn 2 reuses past the image in exact mode too (the warm start
# computes its last exact_min_rows prompt rows again, from a row block).
QUESTION = "What is in this picture? " + " ".join(
    f"Point {i}: say whether the picture shows a cat, a dog, a house or a tree." for i in range(12)
)


def turn1_text(question: str = QUESTION) -> str:
    return f"<|im_start|>user\n{MARK}\n{question}<|im_end|>\n<|im_start|>assistant\n"


def turn2_text(reply: str) -> str:
    return (turn1_text() + reply + "<|im_end|>\n<|im_start|>user\nDescribe its colours in "
            "more detail, please, one by one.<|im_end|>\n<|im_start|>assistant\n")  # fmt: skip


def tokens_before_image(engine: Engine) -> int:
    """Tokens before the image in turn1_text: the most another picture may reuse."""
    return len(engine.tokenize(turn1_text().split(MARK)[0], add_special=False))


def hits_from(engine: Engine, source: str) -> int:
    """Requests so far whose reused prefix came from `source` (none/slot/ram/disk/shared)."""
    stats = engine.stats()
    assert stats is not None
    return dict(stats.hit_sources).get(source, 0)


async def take_the_slot(engine: Engine, topic: str) -> None:
    """A text prompt (its own first block: `topic` differs) that takes an engine's one slot,
    so what the slot held is found in the cache's tiers only."""
    text = f"<|im_start|>user\n{topic}: tell me about it.<|im_end|>\n<|im_start|>assistant\n"
    prompt = tuple(engine.tokenize(text, add_special=False))
    generation = await engine.generate([request(prompt, max_tokens=4)])
    async for _ in generation:
        pass


async def answer(
    engine: Engine, text: str, media: Media, **kw: object
) -> tuple[str, int, list[TokenLogprob]]:
    prompt = tuple(engine.tokenize_media(text, [media], add_special=False))
    generation = await engine.generate([request(prompt, max_tokens=16, media=(media,), **kw)])
    reply, cached, logprobs = "", -1, list[TokenLogprob]()
    async for _, out in generation:
        reply += out.text
        logprobs.extend(out.logprobs)
        if out.finish_reason is not None:
            cached = out.num_cached_tokens
    return reply, cached, logprobs


@pytest.fixture
async def vision() -> AsyncIterator[Engine]:
    e = await start(mmproj=str(projector_path()), n_seq_max=2)
    yield e
    e.close()


async def test_the_projector_loads_and_an_image_takes_its_positions(vision: Engine) -> None:
    assert vision.info.vision and vision.info.media_marker == MARK
    pic = image(1)
    tokens = vision.tokenize_media(turn1_text(), [pic], add_special=False)
    spans = image_spans(tokens, [pic.digest], vision._require_model().vision.identity)  # type: ignore[union-attr]
    assert [(e - s) for s, e, _ in spans] == [IMAGE_TOKENS]
    # the text around the image is tokenized as tokenize() does it
    before, after = turn1_text().split(MARK)
    s, e, _ = spans[0]
    assert tokens[:s] == vision.tokenize(before, add_special=False)
    assert tokens[e:] == vision.tokenize(after, add_special=False)


async def test_same_image_reused_warm_equals_cold_and_another_differs(vision: Engine) -> None:
    pic, other = image(1), image(2)
    reply, _, _ = await answer(vision, turn1_text(), pic)
    # Turn 2: the image and turn 1 come from the slot; only the new text is computed.
    warm, cached, warm_lp = await answer(vision, turn2_text(reply), pic, logprobs=3)
    before = tokens_before_image(vision)
    assert cached >= before + IMAGE_TOKENS
    cold_engine = await start(mmproj=str(projector_path()), n_seq_max=1)
    try:
        cold, cached_cold, cold_lp = await answer(cold_engine, turn2_text(reply), pic, logprobs=3)
    finally:
        cold_engine.close()
    assert cached_cold == 0 and warm == cold and warm_lp == cold_lp
    # Another picture at the same place: nothing past the image's start is reused, and
    # the first token's distribution differs.
    _, cached_other, other_lp = await answer(vision, turn2_text(reply), other, logprobs=3)
    assert cached_other <= before
    assert other_lp[0] != warm_lp[0]


async def test_the_ram_tier_reuses_the_same_image_and_never_another() -> None:
    """One slot and no disk: once a text prompt has taken the slot, the picture's prefix
    can come from RAM alone."""
    pic, other = image(9), image(10)
    config = CacheConfig(block_tokens=16, min_tokens=16)  # disk_dir "": RAM only
    engine = await start(mmproj=str(projector_path()), n_seq_max=1, cache=config)
    try:
        before = tokens_before_image(engine)
        cold, cached_cold, cold_lp = await answer(engine, turn1_text(), pic, logprobs=3)
        assert cached_cold == 0
        await take_the_slot(engine, "Mountains")
        # Another picture at the same place: RAM holds the first one's prefix and lends no
        # more than the text before the image.
        _, cached_other, other_lp = await answer(engine, turn1_text(), other, logprobs=3)
        assert cached_other <= before
        assert other_lp[0] != cold_lp[0]
        await take_the_slot(engine, "Rivers")
        ram_hits = hits_from(engine, "ram")
        warm, cached, warm_lp = await answer(engine, turn1_text(), pic, logprobs=3)
        assert hits_from(engine, "ram") == ram_hits + 1  # this request's prefix: from RAM
        assert cached >= before + IMAGE_TOKENS  # past the image
        assert warm == cold and warm_lp == cold_lp  # exact_reuse: as cold
        # Another tenant (salt) reuses nothing of it: neither the RAM entry nor the slot.
        _, cached_tenant, _ = await answer(engine, turn1_text(), pic, cache_salt="b")
        assert cached_tenant == 0
    finally:
        engine.close()


async def test_restore_from_disk_after_restart_and_tenants_apart(tmp_path: Path) -> None:
    pic, other = image(3), image(4)
    config = CacheConfig(disk_dir=str(tmp_path), block_tokens=16, min_tokens=16)
    engine = await start(mmproj=str(projector_path()), n_seq_max=1, cache=config)
    try:
        first, _, first_lp = await answer(engine, turn1_text(), pic, cache_salt="a", logprobs=3)
    finally:
        engine.close()
    engine = await start(mmproj=str(projector_path()), n_seq_max=1, cache=config)
    try:
        before = tokens_before_image(engine)
        # Another picture at the same place first, while only the disk holds anything: it
        # lends no more than the text before the image.
        _, cached_other, other_lp = await answer(
            engine, turn1_text(), other, cache_salt="a", logprobs=3
        )
        assert cached_other <= before
        assert other_lp[0] != first_lp[0]
        again, cached, again_lp = await answer(
            engine, turn1_text(), pic, cache_salt="a", logprobs=3
        )
        assert cached >= before + IMAGE_TOKENS  # restored past the image
        assert again == first and again_lp == first_lp  # exact_reuse: as cold
        assert hits_from(engine, "disk") == 1
        # Another tenant (salt) reuses nothing of it: neither the disk entry nor the slot.
        _, cached_b, _ = await answer(engine, turn1_text(), pic, cache_salt="b")
        assert cached_b == 0
    finally:
        engine.close()


async def test_bad_images_and_forged_ids_are_refused(vision: Engine) -> None:
    bad = Media(b"\x89PNG but not really", hashlib.sha256(b"x").hexdigest())
    with pytest.raises(InvalidRequestError) as exc:
        vision.tokenize_media(f"{MARK} and {MARK}", [image(1), bad], add_special=False)
    assert exc.value.param == "image 1"
    with pytest.raises(InvalidRequestError) as exc:
        vision.tokenize_media(f"{MARK} and {MARK}", [image(1)], add_special=False)
    assert exc.value.param == "image"
    # A client's token prompt never carries an id < 0, with or without images.
    with pytest.raises(InvalidRequestError) as exc:
        await vision.generate([request((1, -5, 2), max_tokens=1)])
    assert exc.value.param == "prompt"
    with pytest.raises(InvalidRequestError) as exc:
        await vision.generate([request((1, -5, 2), max_tokens=1, media=(image(1),))])
    assert exc.value.param == "prompt"


async def test_a_model_without_projector_takes_no_images() -> None:
    engine = await start(n_seq_max=1)
    try:
        assert not engine.info.vision
        with pytest.raises(InvalidRequestError) as exc:
            engine.tokenize_media(MARK, [image(1)], add_special=False)
        assert exc.value.param == "image"
        req = GenerateRequest("r", (1, 2), max_tokens=1, media=(image(1),))
        with pytest.raises(InvalidRequestError) as exc:
            await engine.generate([req])
        assert exc.value.param == "image"
    finally:
        engine.close()
