"""The pseudo ids of image positions (engine/media.py): stable, apart, found, cut whole."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.media import cut_outside_media, image_spans, media_ids, whole_image_keep

A, B = "a" * 64, "b" * 64


def test_ids_are_negative_int32_and_differ_by_image_place_and_projector() -> None:
    ids = media_ids(A, 300)
    assert all(-(2**31) <= t < 0 for t in ids)
    assert len(set(ids)) == len(ids)  # positions apart within an image
    assert media_ids(A, 300) == ids
    assert not set(media_ids(B, 300)) & set(ids)
    assert media_ids(A, 10, "proj-1") != media_ids(A, 10, "proj-2")


def test_ids_are_the_same_in_another_process() -> None:
    code = "from engine.media import media_ids; print(media_ids('a' * 64, 4, 'p'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(media_ids(A, 4, "p"))


def test_image_spans_find_each_image_in_order() -> None:
    tokens = [1, 2, *media_ids(A, 3), 5, *media_ids(B, 2), *media_ids(A, 3), 9]
    assert image_spans(tokens, [A, B, A]) == [(2, 5, 0), (6, 8, 1), (8, 11, 2)]


@pytest.mark.parametrize(
    "tokens, digests",
    [
        ([1, -5, 2], []),  # a made-up id, no image
        ([1, -5, 2], [A]),  # a made-up id where image 0 should be
        ([1, *media_ids(A, 2)], [B]),  # another image's ids
        ([1, *media_ids(A, 2)], [A, B]),  # an image the prompt does not hold
        ([*media_ids(B, 2), *media_ids(A, 2)], [A, B]),  # out of order
    ],
)
def test_image_spans_refuse_ids_that_are_not_the_images(tokens: list[int], digests: list[str]) -> None:
    with pytest.raises(ValueError):
        image_spans(tokens, digests)


def test_a_cut_inside_an_image_moves_to_its_start() -> None:
    tokens = [1, 2, *media_ids(A, 4), 7, 8]
    assert [cut_outside_media(tokens, c) for c in range(9)] == [0, 1, 2, 2, 2, 2, 6, 7, 8]
    # then to a row block, and to the image before that block if it cuts one
    blocks = [*media_ids(B, 3), 0, *media_ids(A, 6), 1]
    assert whole_image_keep(blocks, 8, lambda n: n - n % 2, 0) == 4
    assert whole_image_keep(blocks, 8, lambda n: n - n % 3, 0) == 3
    assert whole_image_keep(blocks, 8, lambda n: n, 5) == 0  # below the floor: nothing
