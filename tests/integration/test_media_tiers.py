"""Images through the other ways a prefix is reused (issue 50): the shared Redis tier
(after a restart, and never across tenants), a session's pinned slot, and a fork of it. The same picture at the same place is reused
past the image; another picture there never past the image's start (engine/media.py keys
its positions by its digest). RAM, disk and tenants: tests/integration/test_media.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from cache import CacheConfig
from tests.helpers.redis_process import running_redis
from tests.helpers.vision_projector import IMAGE_TOKENS, projector_path
from tests.integration.test_engine import start
from tests.integration.test_media import MARK, answer, image, turn1_text, turn2_text

pytestmark = pytest.mark.model


def text_before_image(engine: object) -> int:
    """Tokens before the image in turn1_text: the most another picture may reuse."""
    return len(engine.tokenize(turn1_text().split(MARK)[0], add_special=False))  # type: ignore[attr-defined]


async def test_the_shared_tier_reuses_the_same_image_and_never_another(tmp_path: Path) -> None:
    pic, other = image(5), image(6)
    with running_redis(tmp_path) as store:
        # RAM and Redis only (no disk): a fresh engine finds the image's KV in Redis alone.
        config = CacheConfig(disk_dir="", shared_url=store.url, block_tokens=16, min_tokens=16)
        engine = await start(mmproj=str(projector_path()), n_seq_max=1, cache=config)
        try:
            first, _, first_lp = await answer(engine, turn1_text(), pic, logprobs=3)
        finally:
            engine.close()  # flushes the writes, the shared tier's too
        engine = await start(mmproj=str(projector_path()), n_seq_max=1, cache=config)
        try:
            # Another picture at the same place first: only the shared tier holds anything,
            # and it lends no more than the text before the image.
            _, cached_other, other_lp = await answer(engine, turn1_text(), other, logprobs=3)
            assert cached_other <= text_before_image(engine)
            assert other_lp[0] != first_lp[0]
            again, cached, again_lp = await answer(engine, turn1_text(), pic, logprobs=3)
            assert cached >= text_before_image(engine) + IMAGE_TOKENS  # past the image
            assert again == first and again_lp == first_lp
            stats = engine.stats()
            assert stats is not None and dict(stats.hit_sources).get("shared") == 1
            # Another tenant (its own cache salt) reuses nothing of it, picture or text.
            _, cached_tenant, _ = await answer(engine, turn1_text(), pic, cache_salt="other")
            assert cached_tenant == 0
        finally:
            engine.close()


async def test_a_session_and_its_fork_reuse_their_image_and_a_fork_with_another_does_not() -> None:
    pic, other = image(7), image(8)
    engine = await start(mmproj=str(projector_path()), n_seq_max=3)
    try:
        before = text_before_image(engine)
        reply, _, _ = await answer(engine, turn1_text(), pic, session_id="main", tenant="k")
        await engine.fork_session("k", "main", "same")
        await engine.fork_session("k", "main", "other")
        # The fork with another picture at the same place: nothing past the image's start.
        _, cached_other, other_lp = await answer(
            engine, turn2_text(reply), other, session_id="other", tenant="k", logprobs=3
        )
        assert cached_other <= before
        # The session, and the fork with the same picture: turn 1 and the image reused.
        main, cached_main, main_lp = await answer(
            engine, turn2_text(reply), pic, session_id="main", tenant="k", logprobs=3
        )
        assert cached_main >= before + IMAGE_TOKENS
        same, cached_same, same_lp = await answer(
            engine, turn2_text(reply), pic, session_id="same", tenant="k", logprobs=3
        )
        assert cached_same >= before + IMAGE_TOKENS
        assert same == main and same_lp == main_lp  # exact_reuse: both as cold
        assert other_lp[0] != main_lp[0]
    finally:
        engine.close()
