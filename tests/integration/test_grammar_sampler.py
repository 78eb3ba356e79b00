"""The engine's grammar sampling on the real model: plain and lazy (pattern or token)."""

from __future__ import annotations

import re

import pytest

from engine.engine import Engine
from engine.types import FinishReason, InvalidRequestError, SamplingParams
from tests.integration.test_engine import GREEDY, chat_prompt, engine, request, run  # noqa: F401

pytestmark = pytest.mark.model


def lazy(
    grammar: str, patterns: tuple[str, ...] = (), tokens: tuple[int, ...] = ()
) -> SamplingParams:
    return SamplingParams(
        temperature=0.0,
        grammar=grammar,
        grammar_lazy=True,
        grammar_trigger_patterns=patterns,
        grammar_trigger_tokens=tokens,
    )


async def test_grammar_forces_the_output(engine: Engine) -> None:  # noqa: F811
    prompt = chat_prompt(engine, "Say something.")
    sampling = SamplingParams(temperature=1.0, seed=3, grammar='root ::= "yes" | "no"')
    text, reason, _, _ = await run(engine, request(prompt, sampling=sampling, max_tokens=8))
    assert text in ("yes", "no") and reason is FinishReason.STOP


async def test_lazy_grammar_is_free_until_triggered(engine: Engine) -> None:  # noqa: F811
    prompt = chat_prompt(engine, "What is the capital of France?")
    free, _, _, _ = await run(engine, request(prompt, max_tokens=12))
    words = free.split()
    assert len(words) >= 3
    # Never triggered: the output is the unconstrained one.
    never = lazy('root ::= "zzz"', patterns=(r"[\s\S]*?(QQQQ)[\s\S]*",))
    text, _, _, _ = await run(engine, request(prompt, sampling=never, max_tokens=12))
    assert text == free
    # Triggered by the first word's text: from there the grammar writes " FORCED".
    first = free[: free.index(words[0]) + len(words[0])]
    pattern = r"[\s\S]*?(" + re.escape(first) + r")[\s\S]*"
    armed = lazy(f'root ::= "{first}" " FORCED"', patterns=(pattern,))
    text, reason, _, _ = await run(engine, request(prompt, sampling=armed, max_tokens=12))
    assert text == first + " FORCED" and reason is FinishReason.STOP


async def test_lazy_grammar_triggered_by_a_token(engine: Engine) -> None:  # noqa: F811
    prompt = chat_prompt(engine, "What is the capital of France?")
    free, _, _, _ = await run(engine, request(prompt, max_tokens=4))
    first_token = engine.tokenize(free, add_special=False)[0]
    piece = engine.detokenize([first_token])
    armed = lazy(f'root ::= "{piece}" "!"', tokens=(first_token,))
    text, reason, _, _ = await run(engine, request(prompt, sampling=armed, max_tokens=12))
    assert text == piece + "!" and reason is FinishReason.STOP


async def test_invalid_grammar_is_a_request_error(engine: Engine) -> None:  # noqa: F811
    prompt = chat_prompt(engine, "Hi")
    with pytest.raises(InvalidRequestError):
        await engine.generate([request(prompt, sampling=lazy("root ::= (", patterns=("x",)))])
