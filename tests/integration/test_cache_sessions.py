"""The prefix cache, sticky sessions and fork on the real model: a warm start must give
exactly the cold output (a cache that returns the wrong state is worse than none)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cache import CacheConfig, CacheHit
from engine.config import SessionLimits
from engine.engine import Engine
from engine.types import GenerateRequest, SamplingParams, SessionNotFoundError
from tests.helpers.exact import reused
from tests.integration.test_engine import start as start_engine

pytestmark = pytest.mark.model

GREEDY = SamplingParams(temperature=0.0)
SYSTEM = (
    "You are a careful assistant for a small bakery. The bakery opens at seven and closes "
    "at six, sells sourdough, rye, baguettes, croissants and seasonal pies, takes orders "
    "by phone, and delivers within five kilometres on weekdays. Answer briefly and kindly, "
    "and never invent prices: when asked for one, say that the staff will call back. "
) * 2
QUESTIONS = ["When do you open?", "Do you sell rye bread?", "Can you deliver on Sunday?"]


async def start(**overrides: object) -> Engine:
    """A small engine (1,024 tokens a sequence, 2 slots) unless told otherwise."""
    return await start_engine(**{"n_ctx": 1024, "n_seq_max": 2, "embeddings": False, **overrides})


@pytest.fixture
async def cold() -> AsyncIterator[Engine]:
    """No prefix cache, one slot per request: the reference outputs."""
    engine = await start(n_seq_max=4)
    yield engine
    engine.close()


def chat(engine: Engine, turns: list[tuple[str, str]], question: str) -> tuple[int, ...]:
    text = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
    for user, assistant in turns:
        text += f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{assistant}<|im_end|>\n"
    text += f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    return tuple(engine.tokenize(text, add_special=False, parse_special=True))


async def run(engine: Engine, prompt: tuple[int, ...], **kw: object) -> tuple[str, int]:
    """Greedy text and cached-token count of one request."""
    request = GenerateRequest(uuid.uuid4().hex, prompt, GREEDY, max_tokens=24, **kw)  # type: ignore[arg-type]
    text, cached = "", -1
    generation = await engine.generate([request])
    async for _, out in generation:
        assert out.error is None, out.error
        text += out.text
        if out.finish_reason is not None:
            cached = out.num_cached_tokens
    return text, cached


def sources(engine: Engine) -> dict[str, int]:
    stats = engine.stats()
    assert stats is not None
    return dict(stats.hit_sources)


async def test_warm_starts_from_ram_disk_and_after_restart_equal_cold(
    cold: Engine, tmp_path: Path
) -> None:
    first, partial = chat(cold, [], QUESTIONS[0]), chat(cold, [], QUESTIONS[1])
    expected = {p: (await run(cold, p))[0] for p in (first, partial)}
    config = CacheConfig(disk_dir=str(tmp_path), block_tokens=32, min_tokens=32)
    engine = await start(n_seq_max=1, cache=config)
    try:
        assert await run(engine, first) == (expected[first], 0)
        await run(engine, chat(engine, [], "x" * 5)[-40:])  # the only slot now holds another prompt
        # Exact hit from RAM: all but the last 64 prompt tokens are restored (they are
        # computed again in a full-size chunk, as a cold prefill computes them).
        assert await run(engine, first) == (expected[first], reused(len(first)))
        assert sources(engine)["ram"] == 1
        # Partial hit: the system prompt is restored, the question prefilled.
        await run(engine, chat(engine, [], "y" * 5)[-40:])
        text, cached = await run(engine, partial)
        assert text == expected[partial] and len(SYSTEM) // 8 < cached < len(partial) - 5
        assert engine.cache_stats().disk.entries >= 1  # type: ignore[union-attr]
    finally:
        engine.close()
    # A restarted engine on the same directory is warm from disk.
    engine = await start(n_seq_max=1, cache=config)
    try:
        assert await run(engine, first) == (expected[first], reused(len(first)))
        assert sources(engine) == {"disk": 1}
    finally:
        engine.close()


async def test_a_state_that_fails_to_restore_falls_back_to_cold(cold: Engine) -> None:
    prompt = chat(cold, [], QUESTIONS[2])
    expected = (await run(cold, prompt))[0]
    engine = await start(cache=CacheConfig(block_tokens=32, min_tokens=32))
    try:
        assert engine._cache is not None
        garbage = CacheHit(prompt, b"\x00" * 1000, len(prompt), "ram")
        engine._cache.lookup = lambda tokens, salt="", held=False: garbage  # type: ignore[method-assign]
        assert await run(engine, prompt) == (expected, 0)
        stats = engine.stats()
        assert stats is not None and stats.num_restore_failures == 1
    finally:
        engine.close()


async def test_many_sessions_over_few_slots_each_get_their_own_state(cold: Engine) -> None:
    """Six three-turn conversations, all at once, on two slots: sessions are reclaimed
    and restored from the cache all the time, and every reply equals the cold one."""
    conversations = [[f"My name is {name}.", "What is my name?", "Spell it."] for name in
                     ("Ada", "Bob", "Cyd", "Dee", "Eve", "Fox")]
    transcripts: list[list[tuple[tuple[int, ...], str]]] = []
    for turns in conversations:  # cold references, one request at a time
        history: list[tuple[str, str]] = []
        steps = []
        for question in turns:
            prompt = chat(cold, history, question)
            reply = (await run(cold, prompt))[0]
            steps.append((prompt, reply))
            history.append((question, reply))
        transcripts.append(steps)
    engine = await start(n_seq_max=2, cache=CacheConfig(block_tokens=32, min_tokens=32))
    try:
        async def converse(i: int) -> list[tuple[str, int]]:
            return [await run(engine, p, session_id=f"s{i}") for p, _ in transcripts[i]]

        results = await asyncio.gather(*(converse(i) for i in range(len(transcripts))))
        for steps, got in zip(transcripts, results, strict=True):
            assert [text for text, _ in got] == [reply for _, reply in steps]
            # Every later turn found the earlier ones (its slot, or the cache).
            assert all(cached > len(SYSTEM) // 8 for _, cached in got[1:])
        stats = engine.stats()
        assert stats is not None and stats.num_reclaims > 0
    finally:
        engine.close()


async def test_session_turns_fork_and_isolation(cold: Engine) -> None:
    engine = await start(n_seq_max=3)
    try:
        turn1 = chat(engine, [], QUESTIONS[0])
        reply1, _ = await run(engine, turn1, session_id="main", tenant="k1")
        a = chat(engine, [(QUESTIONS[0], reply1)], QUESTIONS[1])
        b = chat(engine, [(QUESTIONS[0], reply1)], QUESTIONS[2])
        forked = await engine.fork_session("k1", "main", "branch")
        assert forked.num_tokens >= len(turn1)
        # Both branches continue at once; each equals a cold run of its own transcript.
        (text_a, cached_a), (text_b, cached_b) = await asyncio.gather(
            run(engine, a, session_id="main", tenant="k1"),
            run(engine, b, session_id="branch", tenant="k1"),
        )
        assert text_a == (await run(cold, a))[0] and text_b == (await run(cold, b))[0]
        assert cached_a == cached_b == min(reused(len(turn1), 0), reused(len(a)), reused(len(b)))
        # Another tenant cannot see, use or fork the session.
        with pytest.raises(SessionNotFoundError):
            engine.get_session("k2", "main")
        with pytest.raises(SessionNotFoundError):
            await engine.fork_session("k2", "main")
        # Ids are per tenant: k2's "main" is a new session of its own.
        await run(engine, a, session_id="main", tenant="k2")
        assert engine.get_session("k2", "main") is not engine.get_session("k1", "main")
        # One request at a time per session: a second one at once runs unpinned (the
        # default `when_busy`), and the session stays the first one's.
        request = GenerateRequest("r1", a, GREEDY, max_tokens=24, session_id="main", tenant="k1")
        generation = await engine.generate([request])
        text, _ = await run(engine, a, session_id="main", tenant="k1")
        assert text
        async for _ in generation:
            pass
        assert not engine.get_session("k1", "main").in_flight
        engine.delete_session("k1", "branch")
        with pytest.raises(SessionNotFoundError):
            engine.get_session("k1", "branch")
    finally:
        engine.close()


async def test_n_choices_prefill_the_prompt_once() -> None:
    engine = await start(n_seq_max=3)
    try:
        prompt = chat(engine, [], QUESTIONS[1])
        before = engine.stats()
        assert before is not None
        requests = [
            GenerateRequest(f"c{i}", prompt, SamplingParams(temperature=0.8, seed=i), max_tokens=8)
            for i in range(3)
        ]
        cached = []
        async for _, out in await engine.generate(requests):
            if out.finish_reason is not None:
                cached.append(out.num_cached_tokens)
        after = engine.stats()
        assert after is not None
        prefilled = after.num_prefill_tokens - before.num_prefill_tokens
        assert prefilled == len(prompt) + 2  # once, plus the last token for each other choice
        assert sorted(cached) == [0, len(prompt) - 1, len(prompt) - 1]
    finally:
        engine.close()


async def test_a_session_retired_at_the_key_quota_resumes_warm(cold: Engine) -> None:
    """Issue 17, item 19: at its quota a key's oldest idle session is retired, not its
    new one refused, and the retired one's KV goes to the cache first even when its
    finish could not save it (a busy writer drops saves), so it resumes warm."""
    first = chat(cold, [], QUESTIONS[0])
    reply = (await run(cold, first))[0]
    second = chat(cold, [(QUESTIONS[0], reply)], QUESTIONS[1])
    expected = (await run(cold, second))[0]
    engine = await start(n_seq_max=1, cache=CacheConfig(block_tokens=32, min_tokens=32),
                         sessions=SessionLimits(max_sessions_per_key=1))  # fmt: skip
    try:
        worker = engine._worker
        assert worker is not None and worker.cache is not None
        save = worker.cache.save
        worker.cache.save = lambda *args, **kwargs: False  # type: ignore[method-assign]
        assert (await run(engine, first, session_id="a", tenant="k"))[0] == reply
        worker.cache.save = save  # type: ignore[method-assign]
        other = "<|im_start|>user\nHello! Who are you?<|im_end|>\n<|im_start|>assistant\n"
        other_prompt = tuple(engine.tokenize(other, add_special=False, parse_special=True))
        await run(engine, other_prompt, session_id="b", tenant="k")  # retires a; its slot
        assert [s.id for s in engine.list_sessions("k")] == ["b"]  # now holds another prompt
        text, cached = await run(engine, second, session_id="a", tenant="k")  # retires b
        assert text == expected and cached == min(reused(len(first), 0), reused(len(second)))
    finally:
        engine.close()


async def test_a_short_prompt_pushed_out_of_its_slot_is_found_again_in_ram() -> None:
    """The default cache keeps prompts of one block and more: a short prompt whose slot a
    prompt sharing its head took over (one slot) starts warm when it comes back (the
    server's default reuse, not exact)."""
    engine = await start(n_seq_max=1, exact_reuse=False, cache=CacheConfig(disk_dir=""))
    try:
        first, second = chat(engine, [], QUESTIONS[0]), chat(engine, [], QUESTIONS[1])
        short, other = first[:16] + first[-14:], first[:16] + second[-14:]
        assert short != other
        await run(engine, short)  # with its reply, under 64 tokens
        await run(engine, other)  # takes the one slot, keeping the shared head
        _, cached = await run(engine, short)
        assert cached >= len(short) - 2, cached  # all but the recomputed tail
        assert sources(engine).get("ram", 0) >= 1
    finally:
        engine.close()
