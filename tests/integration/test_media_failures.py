"""Images in the engine when the projector fails, and the engine thread's share of an
image (issue 50): an image that cannot be encoded fails its own request only; the engine
thread encodes the image `tokenize_media` prepared and decodes no image file itself."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from engine.engine import Engine
from engine.llama import vision as vision_module
from engine.types import FinishReason, Media, SeqOutput
from tests.helpers.vision_projector import png, projector_path
from tests.integration.test_engine import chat_prompt, request, start

pytestmark = pytest.mark.model

MARK = "<__media__>"


def image(seed: int) -> Media:
    data = png(48, 48, seed)
    return Media(data, hashlib.sha256(data).hexdigest())


def image_prompt(engine: Engine, pic: Media) -> tuple[int, ...]:
    text = f"<|im_start|>user\n{MARK}\nWhat is in this picture?<|im_end|>\n<|im_start|>assistant\n"
    return tuple(engine.tokenize_media(text, [pic], add_special=False))


async def outcomes(engine: Engine, *requests: object) -> list[tuple[SeqOutput, tuple[int, ...]]]:
    """Each request's last output and all its tokens, in order (submitted together: the
    first step admits them all)."""
    last: dict[int, SeqOutput] = {}
    tokens: dict[int, tuple[int, ...]] = {}
    async for index, out in await engine.generate(list(requests)):  # type: ignore[arg-type]
        last[index] = out
        tokens[index] = tokens.get(index, ()) + out.token_ids
    return [(last[i], tokens.get(i, ())) for i in range(len(requests))]


@pytest.fixture
async def vision() -> AsyncIterator[Engine]:
    e = await start(mmproj=str(projector_path()), n_seq_max=2)
    e._worker.check_kv = True  # type: ignore[union-attr]  # the KV ledger after every step
    yield e
    e.close()


async def test_an_image_that_cannot_be_encoded_fails_its_request_only(
    vision: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    pic = image(1)
    text = chat_prompt(vision, "Name three colours.")
    ((_, alone),) = await outcomes(vision, request(text, max_tokens=8))
    monkeypatch.setattr(vision_module.M, "mtmd_encode_chunk", lambda *_: 1)  # the encoder fails
    (failed, _), (other, other_tokens) = await outcomes(
        vision,
        request(image_prompt(vision, pic), max_tokens=8, media=(pic,)),
        request(text, max_tokens=8),
    )
    assert failed.finish_reason is FinishReason.ERROR
    assert failed.error is not None and "image 0 could not be encoded" in failed.error
    assert "mtmd_encode_chunk failed" in failed.error
    # The text request in the same step went on, to the answer it gives alone.
    assert other.finish_reason is not FinishReason.ERROR and other.error is None
    assert alone and other_tokens == alone
    # The engine thread lives: the same image, the encoder back, is answered.
    monkeypatch.undo()
    ((again, _),) = await outcomes(
        vision, request(image_prompt(vision, pic), max_tokens=8, media=(pic,))
    )
    assert again.finish_reason is not FinishReason.ERROR and again.num_output_tokens > 0
    stats = vision.stats()
    assert stats is not None and stats.num_decode_failures == 0


async def test_the_engine_thread_encodes_what_tokenize_prepared(
    vision: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    pic, other = image(2), image(3)
    prompt = image_prompt(vision, pic)  # decodes the file, off the engine thread
    other_prompt = image_prompt(vision, other)
    decoded: list[int] = []
    real = vision_module.M.mtmd_helper_bitmap_init_from_buf

    def counted(*args: Any) -> Any:
        decoded.append(1)
        return real(*args)

    monkeypatch.setattr(vision_module.M, "mtmd_helper_bitmap_init_from_buf", counted)
    ((out, _),) = await outcomes(vision, request(prompt, max_tokens=4, media=(pic,)))
    assert out.finish_reason is not FinishReason.ERROR and decoded == []
    # One no longer kept (evicted, or tokenized by another process) is still served: the
    # engine thread decodes it then, once.
    vision._require_model().vision._prepared.clear()  # type: ignore[union-attr]
    ((out, _),) = await outcomes(vision, request(other_prompt, max_tokens=4, media=(other,)))
    assert out.finish_reason is not FinishReason.ERROR and len(decoded) == 1
