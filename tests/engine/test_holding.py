"""A held sequence's outputs, merged: the same reply as each one handed over, fewer times."""

from __future__ import annotations

from engine.detokenizer import IncrementalDetokenizer
from engine.sequence import Sequence
from engine.thread import holding
from engine.types import FinishReason, GenerateRequest, SeqOutput, TokenLogprob
from server.serving.state import Choice


def held_seq() -> Sequence:
    seq = Sequence(GenerateRequest("r", (1, 2, 3)), None, IncrementalDetokenizer([b"x"], ()), None)
    seq.holding = True
    return seq


def lp(token: int) -> TokenLogprob:
    return TokenLogprob(token, -0.5, ())


OUTPUTS = [
    SeqOutput("", (), num_prompt_tokens=40, num_cached_tokens=32),  # the prompt's split
    SeqOutput("He", (5,), (lp(5),), prompt_logprobs=(lp(9),)),
    SeqOutput("llo", (6,), (lp(6),)),
    SeqOutput("", (7,), (lp(7),)),  # text held back by the detokenizer
    SeqOutput(
        " there",
        (8,),
        (lp(8),),
        finish_reason=FinishReason.STOP,
        num_prompt_tokens=40,
        num_cached_tokens=32,
        num_output_tokens=4,
        stop_sequence="!",
    ),
]


def read(outputs: list[SeqOutput]) -> Choice:
    """What a reader adding the outputs in turn ends with (its text as one piece)."""
    choice = Choice()
    for out in outputs:
        choice.add(out)
    choice.finished_at = 0.0
    choice.text = ["".join(choice.text)]
    return choice


def test_merged_reads_as_its_parts() -> None:
    for cut in range(1, len(OUTPUTS)):
        head, tail = OUTPUTS[:cut], OUTPUTS[cut:]
        first = head[0]
        for out in head[1:]:
            first = holding.merged(first, out)
        assert read([first, *tail]) == read(OUTPUTS), cut
    # the split known before the prefill survives outputs that do not carry it
    early = holding.merged(OUTPUTS[0], OUTPUTS[2])
    assert (early.num_prompt_tokens, early.num_cached_tokens) == (40, 32)


def test_merged_all_reads_as_its_parts() -> None:
    for start in range(len(OUTPUTS)):
        for stop in range(start + 1, len(OUTPUTS) + 1):
            part = OUTPUTS[start:stop]
            assert read([holding.merged_all(part), *OUTPUTS[stop:]]) == read(
                [*part, *OUTPUTS[stop:]]
            ), (start, stop)
    assert holding.merged_all(OUTPUTS[:2], written=True).written


def test_first_token_then_every_half_second_then_the_end() -> None:
    seq = held_seq()
    released = []
    for out, t in zip(OUTPUTS, [100.0, 100.1, 100.2, 100.7, 100.8], strict=True):
        sent = holding.release(seq, out, t)
        if sent is not None:
            released.append((t, sent))
    # the split waits for the first token (its time to first token is measured), the
    # next token waits, the one half a second after the first goes, the end goes
    assert [t for t, _ in released] == [100.1, 100.7, 100.8]
    assert [o.text for _, o in released] == ["He", "llo", " there"]
    assert released[0][1].num_prompt_tokens == 40
    assert released[1][1].token_ids == (6, 7)
    assert seq.held is None
    assert read([o for _, o in released]) == read(OUTPUTS)
