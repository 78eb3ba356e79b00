"""Speculative decoding on the real model: same output as plain decoding, fewer steps."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from engine.engine import Engine
from engine.types import SamplingParams
from tests.integration.test_engine import chat_prompt, request, run, start

pytestmark = pytest.mark.model

DOCUMENT = (
    "Invoice 2291 from Harbor Supplies Ltd, dated 14 March 2024, billed to Ms. Clara "
    "Jensen, 18 Willow Lane, Dover. Items: twelve oak shelves at 40 pounds each, three "
    "brass lamps at 25 pounds each. Payment is due within thirty days by bank transfer."
)
TASKS = [
    f"Repeat the following text exactly, word for word:\n\n{DOCUMENT}",
    f"Copy this text and change every 'pounds' to 'euros':\n\n{DOCUMENT}",
    f"Extract the customer name, address and invoice number as JSON from:\n\n{DOCUMENT}",
    "Write a short story about a lighthouse keeper.",
]


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    e = await start(n_seq_max=4, n_threads=2, speculative=False)
    yield e
    e.close()


async def both(engine: Engine, prompt: tuple[int, ...], **kw: object) -> tuple[str, str]:
    plain = await run(engine, request(prompt, speculative=False, **kw))
    spec = await run(engine, request(prompt, speculative=True, **kw))
    assert plain[1] == spec[1] and plain[3] == spec[3]  # finish reason, token count
    return plain[0], spec[0]


async def test_greedy_output_is_plain_decoding_output(engine: Engine) -> None:
    before = engine.stats()
    for task in TASKS:
        plain, spec = await both(engine, chat_prompt(engine, task), max_tokens=64)
        assert plain and spec == plain
    after = engine.stats()
    assert after is not None and before is not None
    drafted = after.num_drafted_tokens - before.num_drafted_tokens
    accepted = after.num_accepted_tokens - before.num_accepted_tokens
    # The copying tasks are what drafts are for: most guesses are kept.
    assert drafted > 0 and accepted > drafted // 2, (drafted, accepted)


async def test_seeded_sampling_draws_the_same_tokens(engine: Engine) -> None:
    # Each kept token is sampled from its own row exactly as plain decoding samples
    # it, with the same random draws in the same order: a seed gives the same text.
    sampling = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, seed=1234)
    for task in TASKS[1:2]:
        plain, spec = await both(
            engine, chat_prompt(engine, task), max_tokens=64, sampling=sampling
        )
        assert plain and spec == plain


async def test_stop_strings_and_max_tokens_end_it_where_plain_decoding_does(engine: Engine) -> None:
    prompt = chat_prompt(engine, TASKS[0])
    plain, spec = await both(engine, prompt, max_tokens=64, stop=("pounds",))
    assert spec == plain and "pounds" not in spec
    for limit in (1, 2, 7):
        plain, spec = await both(engine, prompt, max_tokens=limit)
        assert spec == plain


async def test_batched_speculation_equals_plain_decoding_alone(engine: Engine) -> None:
    prompts = [chat_prompt(engine, task) for task in TASKS]
    alone = [(await run(engine, request(p, max_tokens=48, speculative=False)))[0] for p in prompts]
    together = await asyncio.gather(
        *(run(engine, request(p, max_tokens=48, speculative=True)) for p in prompts)
    )
    assert [t[0] for t in together] == alone
