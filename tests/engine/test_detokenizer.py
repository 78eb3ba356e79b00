from __future__ import annotations

import pytest

from engine.detokenizer import IncrementalDetokenizer, held_stop_prefix, split_complete_utf8

# token id -> bytes; "é" is split over two tokens, "🙂" over four.
PIECES = [
    b"Hel",
    b"lo",
    b" wor",
    b"ld",
    b"\xc3",
    b"\xa9",
    b"\xf0",
    b"\x9f",
    b"\x99",
    b"\x82",
    b"EN",
    b"D",
    b"\xff",
]


def run(
    tokens: list[int], stops: tuple[str, ...] = (), include: bool = False
) -> tuple[list[str], bool]:
    detok = IncrementalDetokenizer(PIECES, stops, include)
    out = []
    for t in tokens:
        out.append(detok.push(t))
        if detok.stopped:
            return out, True
    out.append(detok.flush())
    return out, False


def test_plain_text_passes_through_token_by_token() -> None:
    out, stopped = run([0, 1, 2, 3])
    assert out == ["Hel", "lo", " wor", "ld", ""]
    assert not stopped


def test_utf8_is_never_split_mid_character() -> None:
    out, _ = run([0, 4, 5, 6, 7, 8, 9])
    assert out == ["Hel", "", "é", "", "", "", "🙂", ""]


def test_incomplete_utf8_at_the_end_is_replaced_not_dropped() -> None:
    out, _ = run([0, 6, 7])
    assert "".join(out) == "Hel\ufffd"


def test_invalid_byte_becomes_replacement_character() -> None:
    out, _ = run([12, 0])
    assert "".join(out) == "\ufffdHel"


def test_stop_string_split_across_tokens_never_leaks() -> None:
    out, stopped = run([0, 1, 10, 11, 2], stops=("END",))
    assert stopped
    assert "".join(out) == "Hello"
    assert "E" not in "".join(out)


def test_stop_prefix_that_does_not_complete_is_released() -> None:
    out, stopped = run([0, 10, 2], stops=("ENDX",))
    assert not stopped
    assert out[1] == ""  # "EN" held back: could start "ENDX"
    assert "".join(out) == "HelEN wor"


def test_include_stop_string() -> None:
    out, stopped = run([0, 10, 11], stops=("END",), include=True)
    assert stopped and "".join(out) == "HelEND"


def test_earliest_of_several_stops_wins() -> None:
    out, stopped = run([0, 1, 2, 3], stops=("world", "lo w"))
    assert stopped and "".join(out) == "Hel"


def test_stop_string_inside_one_token() -> None:
    out, stopped = run([0, 1, 2], stops=("lo",))
    assert stopped and "".join(out) == "Hel"


def test_stop_with_multibyte_characters() -> None:
    out, stopped = run([0, 4, 5, 1], stops=("élo",))
    assert stopped and "".join(out) == "Hel"


@pytest.mark.parametrize(
    ("data", "cut"),
    [
        (b"abc", 3),
        (b"ab\xc3", 2),
        (b"\xc3\xa9", 2),
        (b"a\xf0\x9f\x99", 1),
        (b"\xf0\x9f\x99\x82", 4),
        (b"", 0),
    ],
)
def test_split_complete_utf8(data: bytes, cut: int) -> None:
    assert split_complete_utf8(data) == cut


def test_held_stop_prefix() -> None:
    assert held_stop_prefix("abc</", ("</s>",)) == 2
    assert held_stop_prefix("abc", ("</s>",)) == 0
    assert held_stop_prefix("xx", ("x", "xxy")) == 2


def test_plain_text_after_an_unfinished_character_keeps_the_bytes_order() -> None:
    # the ASCII shortcut applies only while no bytes are held back
    out, _ = run([4, 0, 6, 7, 1])
    assert "".join(out) == "\ufffdHel\ufffdlo"


@pytest.mark.parametrize("seed", range(20))
def test_any_token_order_releases_what_decoding_all_the_bytes_gives(seed: int) -> None:
    import random

    rng = random.Random(seed)
    tokens = [rng.randrange(len(PIECES)) for _ in range(40)]
    out, _ = run(tokens)
    assert "".join(out) == b"".join(PIECES[t] for t in tokens).decode("utf-8", "replace")
