"""A generation read whole (`hold_outputs`, as non-streamed API replies are) gets the same
reply as one read token by token, in a few hand-overs (real model)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from engine.engine import Engine
from engine.thread import holding
from engine.types import FinishReason, GenerateRequest, SamplingParams, SeqOutput
from server.serving.state import Choice
from tests.integration.test_engine import GREEDY, QUESTIONS, chat_prompt, engine, request  # noqa: F401

pytestmark = pytest.mark.model


async def outputs(
    engine: Engine,  # noqa: F811
    reqs: list[GenerateRequest],
    hold: bool,
) -> list[list[SeqOutput]]:
    generation = await engine.generate(reqs)
    if hold:
        generation.hold_outputs()
    got: list[list[SeqOutput]] = [[] for _ in reqs]
    async with generation:
        async for index, out in generation:
            got[index].append(out)
    return got


def read(outs: list[SeqOutput]) -> Choice:
    choice = Choice()
    for out in outs:
        choice.add(out)
    return choice


def reply(choice: Choice) -> tuple[object, ...]:
    """What a reader makes of a choice (the cache split and stage times left out: the
    second of two runs finds the first's prompt)."""
    return (
        "".join(choice.text),
        choice.token_ids,
        [lp.token_id for lp in choice.logprobs],
        choice.finish_reason,
        choice.num_prompt_tokens,
        choice.num_output_tokens,
    )


async def test_a_held_reply_is_the_same_reply_in_few_outputs(engine: Engine) -> None:  # noqa: F811
    prompt = chat_prompt(engine, QUESTIONS[1])
    sampling = dataclasses.replace(GREEDY, ignore_eos=True)
    logprobs = {"max_tokens": 96, "sampling": sampling, "logprobs": 2}
    (each,) = await outputs(engine, [request(prompt, **logprobs)], hold=False)
    (held,) = await outputs(engine, [request(prompt, **logprobs)], hold=True)
    assert len(each) >= 96
    # the first token alone (its time to first token), then every HOLD_S (at up to 50 ms
    # a token), and the end
    assert 2 <= len(held) <= 4 + 96 * 0.05 / holding.HOLD_S
    assert held[0].token_ids and held[-1].finish_reason is FinishReason.LENGTH
    assert reply(read(held)) == reply(read(each))
    assert read(held).text and read(held).num_prompt_tokens == len(prompt)


async def test_n_choices_and_an_abort_while_held(engine: Engine) -> None:  # noqa: F811
    prompt = chat_prompt(engine, QUESTIONS[2])
    sampling = SamplingParams(temperature=0.0, ignore_eos=True)
    reqs = [request(prompt, max_tokens=40, sampling=sampling) for _ in range(3)]
    each = await outputs(engine, reqs, hold=False)
    again = [request(prompt, max_tokens=40, sampling=sampling) for _ in range(3)]
    held = await outputs(engine, again, hold=True)
    assert [reply(read(o)) for o in held] == [reply(read(o)) for o in each]
    assert all(len(o) < 40 for o in held)
    # an abort ends a held sequence with everything it had made so far
    generation = await engine.generate([request(prompt, max_tokens=4000, sampling=sampling)])
    generation.hold_outputs()
    got: list[SeqOutput] = []
    async for _, out in generation:
        got.append(out)
        if len(got) == 1:
            await asyncio.sleep(0.3)
            generation.abort()
    assert got[-1].finish_reason is FinishReason.ABORT
    assert len(read(got).token_ids) == got[-1].num_output_tokens > 1
