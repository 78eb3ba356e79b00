"""server/serving/spliced.py: a replayed turn enters the prompt as the ids sampled for
it, the text around it tokenized as before; where that cannot be trusted, the text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chat.replay import ReplayedPrompt, Splice
from chat.template import RenderedPrompt
from server.serving.prepare import prompt_ids

EOT, BOS, JOINT, GET = 256, 257, 300, 301
PIECES = {EOT: b"", BOS: b"", JOINT: b"><", GET: b"get"}
SPECIAL = {EOT: b"<|im_end|>", BOS: b"<s>"}


@dataclass
class Info:
    media_marker: str = ""


class Tokenizer:
    """Bytes, but '><' and 'get' are one token each (as a BPE merges them) and
    '<|im_end|>' is the end-of-turn token; `space_prefix`: SentencePiece's leading space."""

    def __init__(self, space_prefix: bool = False):
        self.info = Info()
        self.space_prefix = space_prefix

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        if self.space_prefix:
            text = " " + text
        out, data = [BOS] if add_special else [], text.encode()
        while data:
            for token, piece in ((EOT, b"<|im_end|>"), (JOINT, b"><"), (GET, b"get")):
                if data.startswith(piece):
                    out.append(token)
                    data = data[len(piece) :]
                    break
            else:
                out.append(data[0])
                data = data[1:]
        return out

    def token_bytes(self, token: int) -> bytes:
        return PIECES.get(token, bytes([token]) if token < 256 else b"")

    def special_piece(self, token: int) -> bytes:
        return SPECIAL.get(token, self.token_bytes(token))


def ids(text: str) -> list[int]:
    return list(text.encode())


HEAD, CALL, TAIL = "user: hi\nassistant>", "<call>get</call>", "<|im_end|>tool: 20C"


def spliced(sampled: tuple[int, ...]) -> ReplayedPrompt:
    text = HEAD + CALL + TAIL
    return ReplayedPrompt(text, True, (Splice(len(HEAD), len(HEAD) + len(CALL), sampled),))


def tokens(engine: Any, prompt: RenderedPrompt) -> list[int]:
    return prompt_ids(engine, prompt, (), add_special=prompt.add_bos)


def test_the_turn_enters_as_sampled_between_the_text_tokenized() -> None:
    engine = Tokenizer()
    # sampled: '<' apart from the prompt's '>', and 'get' letter by letter, then the
    # end-of-turn token (sampled, never decoded: the template writes its own)
    sampled = (*ids("<call>g"), *ids("et</call>"), EOT)
    out = tokens(engine, spliced(sampled))
    assert out == engine.tokenize(HEAD) + list(sampled[:-1]) + engine.tokenize(
        TAIL, add_special=False
    )
    whole = engine.tokenize(HEAD + CALL + TAIL)
    assert out != whole and JOINT in whole and GET in whole  # what the text alone gives


def test_ids_that_do_not_spell_the_text_give_the_text_tokenized() -> None:
    engine = Tokenizer()
    cut = (*ids("<call>get</call>\nmore"), EOT)  # a stop string cut the text, not the ids
    out = tokens(engine, spliced(cut))
    assert out == (engine.tokenize(HEAD) + engine.tokenize(CALL, add_special=False)
                   + engine.tokenize(TAIL, add_special=False))  # fmt: skip
    assert tokens(engine, spliced(())) == out  # ids unknown


def test_a_tokenizer_that_adds_a_leading_space_gets_the_whole_text() -> None:
    engine = Tokenizer(space_prefix=True)
    sampled = (*ids(CALL), EOT)
    assert tokens(engine, spliced(sampled)) == engine.tokenize(HEAD + CALL + TAIL)


def test_a_prompt_without_splices_is_tokenized_whole() -> None:
    engine = Tokenizer()
    prompt = RenderedPrompt(HEAD + CALL + TAIL, False)
    assert tokens(engine, prompt) == engine.tokenize(HEAD + CALL + TAIL, add_special=False)
