"""Exact reuse on the real model, with and without flash attention: a warm start gives
the cold start's logits bit for bit, alone or beside a decoding sequence, while it
computes again only the last exact_min_rows(flash_attn) prompt tokens (64 / 2)."""

from __future__ import annotations

import dataclasses

import pytest

from engine.engine import Engine
from engine.exact_rules import exact_min_rows
from engine.types import TokenLogprob
from tests.helpers.exact import reused
from tests.integration.test_engine import GREEDY, chat_prompt, request, start

pytestmark = pytest.mark.model

QUESTION = (
    "Here are the opening hours of the library: Monday to Friday from eight to eight, "
    "Saturday from ten to four, closed on Sunday and on public holidays. Members may "
    "borrow ten books for three weeks, renew them twice online, and reserve new titles. "
    "When can I return a book on a Saturday afternoon?"
)


async def logprobs_of(engine: Engine, prompt: tuple[int, ...]) -> tuple[list[TokenLogprob], int]:
    """The greedy tokens' log-probabilities (top 5 too) and the prompt tokens reused."""
    generation = await engine.generate([request(prompt, max_tokens=8, logprobs=5)])
    logprobs, cached = [], -1
    async for _, out in generation:
        assert out.error is None, out.error
        logprobs.extend(out.logprobs)
        if out.finish_reason is not None:
            cached = out.num_cached_tokens
    return logprobs, cached


@pytest.mark.parametrize("flash_attn", [False, True])
async def test_warm_logits_equal_cold_ones_bit_for_bit(flash_attn: bool) -> None:
    engine = await start(
        flash_attn=flash_attn, n_ctx=1024, n_seq_max=2, embeddings=False, n_threads=2
    )
    rows = exact_min_rows(flash_attn)
    try:
        prompt = chat_prompt(engine, QUESTION)
        assert len(prompt) > 64
        cold, cached = await logprobs_of(engine, prompt)
        assert cached == 0 and cold
        warm, cached = await logprobs_of(engine, prompt)  # its slot holds the prompt
        assert cached == reused(len(prompt), rows)
        assert warm == cold
        # Beside a decoding sequence: each prompt chunk still gets a decode of its own.
        busy = request(
            chat_prompt(engine, "Count to a hundred."),
            max_tokens=500,
            sampling=dataclasses.replace(GREEDY, ignore_eos=True),
        )
        generation = await engine.generate([busy])
        async for _, out in generation:
            if out.token_ids:
                break
        beside = [await logprobs_of(engine, prompt) for _ in range(2)]
        generation.abort()
        assert [b[0] for b in beside] == [cold, cold]
        assert beside[-1][1] == reused(len(prompt), rows)
    finally:
        engine.close()
