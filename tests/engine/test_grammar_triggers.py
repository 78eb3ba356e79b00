"""Trigger words become trigger tokens or patterns against the engine's vocabulary."""

from __future__ import annotations

import re

from engine.grammar import LazyTrigger, word_triggers

VOCAB = {"<tool_call>": [7], "[TOOL_CALLS]": [3, 4, 5]}


def tokenize(word: str) -> list[int]:
    return VOCAB[word]


def test_a_one_token_word_triggers_on_its_token_any_other_on_its_text() -> None:
    patterns, tokens = word_triggers(["<tool_call>", "[TOOL_CALLS]"], tokenize)
    assert tokens == [7]
    assert patterns == [r"[\s\S]*?(" + re.escape("[TOOL_CALLS]") + r")[\s\S]*"]
    trigger = LazyTrigger(patterns, tokens)
    assert trigger.feed(b"some text [TOOL") is None
    assert trigger.feed(b"_CALLS] {") == b"[TOOL_CALLS] {"  # the grammar starts at the word


def test_no_words_no_triggers() -> None:
    assert word_triggers([], tokenize) == ([], [])
