"""A prompt's token ids, with the replayed tool turns as the ids the model sampled.

chat/replay.py splices a sampled turn's text back into the prompt and says where
(`ReplayedPrompt.splices`). Tokenizing that text again need not give the ids the model
sampled: a grammar may have made it spell `get_weather` as `g` `et` `_` `weather`, and
a generation prompt ending in `>` before a call starting with `<` tokenizes as one `><`
(SmolLM2), so the prompt would part from the KV there. Here the text before a splice is
tokenized as the prompt the turn followed was (it is that prompt: the replay checked its
digest), then the sampled ids follow, then the text after them is tokenized.

Measured on SmolLM2 with issue 47's end-to-end test (tests/integration/
test_family_dialects.py): turn 2 reuses through the call's last token for Qwen3, Granite
4, Kimi K2 and Gemma 4, where tokenizing the text again stopped inside the call or at
turn 1's last prompt token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from chat.replay import Splice
from server.http.deps import EngineLike

# How a piece of the prompt tokenizes, its images' positions included:
# (text, its images, add_special) -> ids (server/serving/prepare.py text_ids).
Tokens = Callable[[str, Sequence[Any], bool], list[int]]


def spliced_ids(
    engine: EngineLike,
    text: str,
    splices: Sequence[Splice],
    images: Sequence[Any],
    add_special: bool,
    tokenize: Tokens,
) -> list[int] | None:
    """The ids of a prompt with sampled turns spliced in (blocking; the caller checked
    there are splices), or None where a piece cannot be tokenized apart (the caller
    tokenizes the whole text then)."""
    marker = engine.info.media_marker
    left = list(images)
    ids: list[int] = []
    at = 0

    def tokens(start: int, end: int) -> list[int] | None:
        """text[start:end]'s ids with the images its markers stand for (the next ones)."""
        piece = text[start:end]
        num_images = piece.count(marker) if marker else 0
        mine = left[:num_images]
        del left[:num_images]
        if start == 0:  # the prompt's head, tokenized as the prompt it was
            return tokenize(piece, mine, add_special)
        if not piece:
            return []
        out = tokenize(piece, mine, False)
        # A tokenizer that starts a text with a space (SentencePiece's add_space_prefix)
        # would write one into the middle of the prompt: not the prompt's text.
        first = engine.special_piece(out[0]) if out and out[0] >= 0 else b""
        return out if piece.encode("utf-8", "surrogatepass").startswith(first) else None

    for splice in splices:
        head = tokens(at, splice.start)
        span = text[splice.start : splice.end]
        sampled = _sampled_ids(engine, splice.token_ids, span)
        if sampled is None or (marker and marker in span):
            sampled = tokens(splice.start, splice.end)  # not the ids of this text: as before
        if head is None or sampled is None:
            return None
        ids += head + sampled
        at = splice.end
    tail = tokens(at, len(text))
    return None if tail is None or left else ids + tail


def _sampled_ids(engine: EngineLike, token_ids: Sequence[int], text: str) -> list[int] | None:
    """The ids sampled for `text` without the end-of-turn token after them (sampled,
    never decoded; the template writes its own), or None where they do not spell
    `text` (a turn cut by a stop string: its text ends before its ids do)."""
    ids = list(token_ids)
    while ids and not engine.token_bytes(ids[-1]):
        ids.pop()
    if not ids:
        return None
    spelled = b"".join(engine.token_bytes(t) for t in ids)
    return ids if spelled == text.encode("utf-8", "surrogatepass") else None
