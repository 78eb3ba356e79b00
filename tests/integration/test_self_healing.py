"""The engine heals itself (real model): time limits, an interrupted decode, a dead
engine thread rebuilt in place, and no grammar path that makes llama.cpp throw."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from engine.engine import Engine
from engine.types import (
    FinishReason,
    InvalidRequestError,
    SamplingParams,
    SessionNotFoundError,
    TimeLimits,
    error_code,
)
from tests.integration.test_engine import chat_prompt, request, start

pytestmark = pytest.mark.model
ROOT = Path(__file__).parent.parent.parent


async def outcome(engine: Engine, req: object) -> tuple[str, FinishReason | None, str | None]:
    text, reason, error = "", None, None
    async for _, out in await engine.generate([req]):  # type: ignore[list-item]
        text += out.text
        if out.finish_reason is not None:
            reason, error = out.finish_reason, out.error
    return text, reason, error


async def test_a_dead_engine_thread_is_rebuilt_and_serves_again() -> None:
    engine = await start(n_seq_max=2, n_threads=1, embeddings=False)
    try:
        prompt = chat_prompt(engine, "Say hi.")
        worker = engine._worker
        assert worker is not None

        def boom(*_: object) -> None:
            raise RuntimeError("injected")

        worker.step = boom  # type: ignore[method-assign]
        worker._fail_everything = boom  # type: ignore[method-assign]  # the loop dies
        _, reason, error = await outcome(engine, request(prompt, max_tokens=4))
        assert reason is FinishReason.ERROR and error_code(error) == "engine_restarted"
        assert "injected" in (error or "")
        for _ in range(500):  # the requests failed at once; the rebuild follows
            if engine._worker is not worker and engine.ready:
                break
            await asyncio.sleep(0.01)
        assert engine._worker is not worker and engine.ready
        text, reason, _ = await outcome(engine, request(prompt, max_tokens=4))
        assert reason is FinishReason.LENGTH and text
        stats = engine.stats()
        assert stats is not None and stats.num_rebuilds == 1
    finally:
        engine.close()


async def test_time_limits_end_the_request_and_free_the_slot() -> None:
    engine = await start(n_seq_max=1, n_threads=1, embeddings=False,
                         prefill_timeout_s=1e-6)  # fmt: skip
    try:
        prompt = chat_prompt(engine, "Say hi.")
        _, reason, error = await outcome(engine, request(prompt, max_tokens=4))
        assert reason is FinishReason.ERROR and error_code(error) == "prefill_timeout"
        assert engine._worker is not None
        engine._worker.limits = TimeLimits(token_s=1e-6)
        _, reason, error = await outcome(engine, request(prompt, max_tokens=8))
        assert reason is FinishReason.ERROR and error_code(error) == "token_timeout"
        engine._worker.limits = TimeLimits()  # the one slot is free again
        _, reason, _ = await outcome(engine, request(prompt, max_tokens=4))
        assert reason is FinishReason.LENGTH
    finally:
        engine.close()


async def test_a_decode_past_its_budget_is_interrupted_and_the_engine_carries_on() -> None:
    engine = await start(n_seq_max=1, n_threads=1, embeddings=False, exact_reuse=False,
                         decode_timeout_s=0.05)  # fmt: skip
    try:
        long = tuple(engine.tokenize("The quick brown fox jumps over the lazy dog. " * 45))
        _, reason, error = await outcome(engine, request(long, max_tokens=2))
        assert reason is FinishReason.ERROR and error_code(error) == "decode_timeout"
        stats = engine.stats()
        assert stats is not None and stats.num_decode_aborts >= 1
        assert engine._worker is not None
        engine._worker.limits = TimeLimits()
        text, reason, _ = await outcome(engine, request(long, max_tokens=3))
        assert reason is FinishReason.LENGTH and text
    finally:
        engine.close()


@pytest.fixture
async def one_slot() -> AsyncIterator[Engine]:
    engine = await start(n_seq_max=1, n_threads=1, embeddings=False)
    try:
        yield engine
    finally:
        engine.close()


async def test_integers_beyond_int32_are_refused_naming_the_field(one_slot: Engine) -> None:
    prompt = chat_prompt(one_slot, "Hi")
    with pytest.raises(InvalidRequestError) as info:
        await one_slot.generate([request(prompt, sampling=SamplingParams(top_k=10**32))])
    assert info.value.param == "top_k"
    with pytest.raises(InvalidRequestError) as info:
        await one_slot.generate([request(prompt, max_tokens=2**31)])
    assert info.value.param == "max_tokens"


async def test_unsafe_grammars_are_refused_before_llama_cpp_sees_them(one_slot: Engine) -> None:
    prompt = chat_prompt(one_slot, "Hi")
    for gbnf in ("root ::= " + "(" * 5000 + '"a"' + ")" * 5000, 'root ::= "a"{0,999999999}'):
        with pytest.raises(InvalidRequestError) as info:
            await one_slot.generate([request(prompt, sampling=SamplingParams(grammar=gbnf))])
        assert info.value.param == "grammar"


def fuzz(*args: str) -> None:
    # In a subprocess: a C++ exception through ctypes would end it, not pytest.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.grammar_fuzz", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    tail = (done.stdout + done.stderr)[-3000:]
    assert done.returncode == 0, tail
    assert f"SURVIVED {args[1]}" in done.stdout, tail


def test_the_reported_llama3_tool_call_crash_is_gone() -> None:
    fuzz("0", "12", "issue")  # seeds 0..11, as reported


def test_random_grammars_templates_tools_and_seeds_do_not_kill_the_process() -> None:
    fuzz(os.environ.get("KVSERVE_FUZZ_SEED", "7"), os.environ.get("KVSERVE_FUZZ_CASES", "12"))


async def test_a_cancelled_fork_leaves_no_session_and_no_pinned_slot() -> None:
    engine = await start(n_seq_max=2, n_threads=1, embeddings=False)
    try:
        prompt = chat_prompt(engine, "Say hi.")
        req = request(prompt, max_tokens=2, session_id="main", tenant="k")
        assert (await outcome(engine, req))[1] is FinishReason.LENGTH
        fork = asyncio.ensure_future(engine.fork_session("k", "main", "branch"))
        await asyncio.sleep(0)  # the Fork command is queued
        fork.cancel()
        with pytest.raises(asyncio.CancelledError):
            await fork
        for _ in range(500):  # the engine thread runs the fork, then the release
            worker = engine._worker
            if worker is not None and "branch" not in worker.scheduler.slots.pins:
                break
            await asyncio.sleep(0.01)
        with pytest.raises(SessionNotFoundError):
            engine.get_session("k", "branch")
        assert engine._worker is not None and "branch" not in engine._worker.scheduler.slots.pins
    finally:
        engine.close()
