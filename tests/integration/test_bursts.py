"""A burst of requests is admitted into one engine step (engine/arrivals.py): an idle
engine woken by the first waits while the others are still on their way, and never
longer than BURST_WAIT_S."""

from __future__ import annotations

import asyncio
import time

import pytest

import engine.worker
from engine.arrivals import ARRIVAL, Ticket
from engine.engine import Engine
from engine.types import Timings
from tests.integration.test_engine import QUESTIONS, chat_prompt, request, start

pytestmark = pytest.mark.model


async def finish_timings(e: Engine, question: str, ticket: Ticket | None) -> Timings:
    ARRIVAL.set(ticket)  # this task's own context, as the HTTP layer sets it
    generation = await e.generate([request(chat_prompt(e, question), max_tokens=2)])
    async for _, out in generation:
        if out.finish_reason is not None:
            assert out.timings is not None
            return out.timings
    raise AssertionError("no finish")


async def arrive_later(e: Engine, question: str, ticket: Ticket, delay: float) -> Timings:
    await asyncio.sleep(delay)  # still being prepared (parsed, templated, tokenized)
    return await finish_timings(e, question, ticket)


async def test_requests_still_arriving_join_the_first_ones_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(engine.worker, "BURST_WAIT_S", 5.0)  # room for a loaded machine
    e = await start(n_seq_max=4, embeddings=False)
    try:
        tickets = [e.arrivals.expect() for _ in range(3)]
        timings = await asyncio.gather(
            *(arrive_later(e, QUESTIONS[i], t, 0.1 * i) for i, t in enumerate(tickets))
        )
        assert len({t.scheduled for t in timings}) == 1  # one step for all three
        assert timings[0].scheduled is not None and timings[2].arrival is not None
        assert timings[0].scheduled >= timings[2].arrival  # the first waited for the last
        assert e.arrivals.count == 0
        # Without open tickets, a request is scheduled at once, not after a wait.
        alone = await finish_timings(e, QUESTIONS[3], None)
        assert alone.scheduled is not None and alone.scheduled - alone.arrival < 1.0
    finally:
        e.close()


async def test_a_ticket_left_open_delays_the_step_only_by_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(engine.worker, "BURST_WAIT_S", 0.3)
    e = await start(n_seq_max=2, embeddings=False)
    try:
        lost = e.arrivals.expect()  # a request that never reaches the engine
        started = time.monotonic()
        timings = await finish_timings(e, QUESTIONS[0], None)
        assert timings.scheduled is not None
        assert timings.scheduled - timings.arrival >= 0.25  # it waited for the lost one ...
        assert time.monotonic() - started < 60  # ... but not for ever
        lost.close()
        lost.close()  # closing twice counts once
        assert e.arrivals.count == 0
    finally:
        e.close()
