"""`Generation`, the reader's side of one request's outputs: order, the end of each
sequence, coalescing, and the heartbeat's timing (one timer for a whole stream)."""

from __future__ import annotations

import asyncio
import itertools
import time

from engine.loop.generation import Generation
from engine.types import FinishReason, SeqOutput


def make(n: int = 1) -> tuple[Generation, list[list[str]]]:
    aborted: list[list[str]] = []
    return Generation([f"r{i}" for i in range(n)], aborted.append), aborted


def text(t: str) -> SeqOutput:
    return SeqOutput(t, (1,))


def end(t: str = "") -> SeqOutput:
    return SeqOutput(t, (), finish_reason=FinishReason.STOP)


async def test_outputs_arrive_in_order_until_every_sequence_ends() -> None:
    gen, _ = make(2)
    loop = asyncio.get_running_loop()
    for i, out in enumerate([text("a"), text("b"), end(), text("c"), end()]):
        loop.call_later(0.01 * i, gen.put, i % 2 if i < 3 else 1, out)
    seen = [(i, o.text, o.finish_reason) async for i, o in gen]
    assert seen == [(0, "a", None), (1, "b", None), (0, "", FinishReason.STOP),
                    (1, "c", None), (1, "", FinishReason.STOP)]  # fmt: skip
    assert gen.finished


async def test_ready_nowait_takes_what_waits_and_counts_the_ends() -> None:
    gen, _ = make(1)
    gen.put(0, text("a"))
    gen.put(0, text("b"))
    gen.put(0, end("!"))
    assert [o.text for _, o in gen.ready_nowait()] == ["a", "b", "!"]
    assert gen.finished
    assert gen.ready_nowait() == []


async def test_a_heartbeat_after_each_silence_and_none_while_outputs_flow() -> None:
    gen, _ = make(1)
    loop = asyncio.get_running_loop()
    idle = 0.1
    start = time.monotonic()
    # outputs every 30 ms for 0.3 s (no heartbeat), then 0.35 s of silence, then the end
    for i in range(10):
        loop.call_later(0.03 * (i + 1), gen.put, 0, text(str(i)))
    loop.call_later(0.65, gen.put, 0, end())
    events: list[tuple[float, str | None]] = []
    async for item in gen.outputs(idle):
        events.append((time.monotonic() - start, None if item is None else item[1].text))
    beats = [t for t, what in events if what is None]
    last_text = max(t for t, what in events if what == "9")
    assert [what for _, what in events if what is not None] == [*map(str, range(10)), ""]
    assert all(t > last_text for t in beats)  # none while outputs came every 30 ms
    assert len(beats) == 3, events  # at +0.1, +0.2, +0.3 s of the 0.35 s silence
    first_gap = beats[0] - last_text
    assert idle * 0.9 <= first_gap < idle * 1.9, events
    assert all(idle * 0.9 <= b - a < idle * 1.9 for a, b in itertools.pairwise(beats)), events


async def test_the_heartbeat_timer_stops_with_the_stream() -> None:
    gen, _ = make(1)
    loop = asyncio.get_running_loop()
    loop.call_later(0.01, gen.put, 0, end())
    before = len(loop._scheduled)  # type: ignore[attr-defined]
    async for _ in gen.outputs(0.05):
        pass
    await asyncio.sleep(0.12)  # a timer left behind would have fired and set itself again
    live = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
    assert len(live) <= before - 1  # the put's handle has run; no heartbeat timer remains


async def test_a_reader_cancelled_while_waiting_leaves_no_waiter() -> None:
    gen, _ = make(1)
    reader = asyncio.ensure_future(anext(aiter(gen.outputs(10.0))))
    await asyncio.sleep(0.01)
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)
    gen.put(0, text("a"))  # nobody waits: no error, the output stays for the next reader
    assert [o.text for _, o in gen.ready_nowait()] == ["a"]


async def test_leaving_early_aborts_the_open_sequences() -> None:
    gen, aborted = make(2)
    gen.put(0, end())
    async with gen:
        async for _ in gen:
            break
    assert aborted == [["r1"]]
