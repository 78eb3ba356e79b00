"""Regressions for wrong KV state (issue 9): a KV copy between slots must never pick up
a state restored into its source, and a session deleted while its request runs must not
leak into whoever takes its id next. Each reply is compared with the cold reply."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator

import pytest

from cache import CacheConfig
from engine.commands import Fork
from engine.engine import Engine, Generation
from engine.types import GenerateRequest, InvalidRequestError, SamplingParams, SessionBusyError
from tests.integration.test_engine import start as start_engine

pytestmark = pytest.mark.model

GREEDY = SamplingParams(temperature=0.0)
FILLER = " This memo describes the storage room, the shelves, the lamps and the door." * 6
MEMO_A = "Public memo for Alpha Inc. The vault access code is 2580." + FILLER
MEMO_B = "Confidential memo for Bravo Corp. The vault access code is 7431." + FILLER
NEXT_B = " Next, the memo lists the opening hours of the storage room and the staff."
QUESTION = (
    " Question: What is the vault access code mentioned in this memo? Answer: The vault"
    " access code is"
)
CACHE = CacheConfig(block_tokens=32, min_tokens=32)


async def start(**overrides: object) -> Engine:
    engine = await start_engine(**{"n_ctx": 1024, "n_seq_max": 2, "embeddings": False, **overrides})
    assert engine._worker is not None
    engine._worker.check_kv = True  # the KV ledger is checked after every step
    return engine


@pytest.fixture
async def cold() -> AsyncIterator[Engine]:
    engine = await start(cache=None)
    yield engine
    engine.close()


def request(engine: Engine, text: str, max_tokens: int, key: str, **kw: object) -> GenerateRequest:
    prompt = tuple(engine.tokenize(text, add_special=True, parse_special=False))
    kw.setdefault("sampling", GREEDY)
    return GenerateRequest(
        uuid.uuid4().hex, prompt, max_tokens=max_tokens, tenant=key, cache_salt=key, **kw  # type: ignore[arg-type]
    )


async def collect(generation: Generation) -> str:
    text = ""
    async for _, out in generation:
        assert out.error is None, out.error
        text += out.text
    return text


async def reply(engine: Engine, text: str, max_tokens: int, key: str, **kw: object) -> str:
    return await collect(await engine.generate([request(engine, text, max_tokens, key, **kw)]))


def hold_engine_thread(engine: Engine) -> threading.Event:
    """Park the engine thread inside a command until the event is set, so that the
    commands queued meanwhile are all taken in one round (one admission)."""
    release = threading.Event()
    assert engine._worker is not None
    engine._worker.commands.put(Fork("no-such-session", "parked", lambda *_: release.wait(30)))
    return release


async def test_a_fork_never_copies_a_state_restored_into_its_source(cold: Engine) -> None:
    """Issue 9, item 1a: key A forks its session; key B's next request reclaims the
    source slot and restores B's cached memo into it before the fork's copy was done."""
    expected = await reply(cold, MEMO_A + QUESTION, 6, "ka")
    engine = await start(cache=CACHE)
    try:
        await reply(engine, MEMO_B, 2, "kb")
        await reply(engine, MEMO_A, 2, "ka", session_id="S")
        await engine.fork_session("ka", "S", "F")
        await reply(engine, MEMO_B + NEXT_B, 2, "kb")  # reclaims S's slot, restores B
        assert await reply(engine, MEMO_A + QUESTION, 6, "ka", session_id="F") == expected
        assert await reply(engine, MEMO_A + QUESTION, 6, "ka") == expected  # the cache
        stats = engine.stats()
        assert stats is not None and stats.num_reclaims >= 1
    finally:
        engine.close()


async def test_a_prefix_copy_never_reads_a_slot_reclaimed_in_the_same_round(
    cold: Engine,
) -> None:
    """Issue 9, item 1b: request 1 copies a prefix from idle session S's slot, request 2
    (another key) reclaims that slot and restores into it, in one admission round."""
    expected_a = await reply(cold, MEMO_A + QUESTION, 6, "ka")
    expected_b = await reply(cold, MEMO_B + NEXT_B, 2, "kb")
    engine = await start(cache=CACHE)
    try:
        await reply(engine, MEMO_B, 2, "kb")  # in the cache
        await reply(engine, MEMO_A, 2, "ka", session_id="S")  # pins a slot, idle
        release = hold_engine_thread(engine)
        first = await engine.generate([request(engine, MEMO_A + QUESTION, 6, "ka")])
        second = await engine.generate([request(engine, MEMO_B + NEXT_B, 2, "kb")])
        release.set()
        assert await collect(first) == expected_a
        assert await collect(second) == expected_b
        assert await reply(engine, MEMO_A + QUESTION, 6, "ka") == expected_a
    finally:
        engine.close()


async def test_a_session_with_a_request_in_flight_cannot_be_deleted() -> None:
    """Issue 9, item 2: deleting a busy session answers 409; its request's end touches
    only the session it began on, and the queue does not stall behind it."""
    engine = await start(cache=CACHE)
    try:
        long = await engine.generate([request(engine, MEMO_A, 48, "ka", session_id="S")])
        await asyncio.sleep(0.05)
        with pytest.raises(SessionBusyError):
            engine.delete_session("ka", "S")
        await collect(long)
        session = engine.get_session("ka", "S")
        assert session.num_tokens > 0 and not session.in_flight
        engine.delete_session("ka", "S")  # idle now: fine
        fresh = engine.create_session("ka", "S")
        assert fresh.num_tokens == 0
        # A sessionless request is not held up by anything the old session left (a
        # bound on a hang, not a timing test: this machine may be very busy).
        assert await asyncio.wait_for(reply(engine, MEMO_B, 2, "kb"), 300)
    finally:
        engine.close()


async def test_a_refused_request_leaves_no_session_behind() -> None:
    """Issue 9, item 6: a request refused with 400 (a bad grammar) creates nothing."""
    engine = await start(cache=None)
    try:
        bad = SamplingParams(temperature=0.0, grammar="root ::= (")
        for i in range(3):
            with pytest.raises(InvalidRequestError, match="grammar"):
                await engine.generate(
                    [request(engine, MEMO_A, 2, "ka", session_id=f"s{i}", sampling=bad)]
                )
        assert len(engine.sessions) == 0
        # An existing session survives a refused request, idle and unchanged.
        await reply(engine, MEMO_A, 2, "ka", session_id="kept")
        tokens = engine.get_session("ka", "kept").num_tokens
        with pytest.raises(InvalidRequestError):
            await engine.generate([request(engine, MEMO_A, 2, "ka", session_id="kept", sampling=bad)])
        kept = engine.get_session("ka", "kept")
        assert kept.num_tokens == tokens and not kept.in_flight and len(engine.sessions) == 1
    finally:
        engine.close()
