"""A stream's lane on the engine thread (engine/thread/lanes.py) and on the reader's side
(`Generation`): what the lane wrote reaches the reader marked, merged, in order with what
it declined; the reader tells the lane when it has sent all it was left."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from engine.lane import DECLINED, WRITTEN
from engine.loop.generation import Generation
from engine.sequence import Sequence
from engine.thread.holding import HOLD_S
from engine.thread.lanes import handed
from engine.thread.stats import StepCounters
from engine.types import FinishReason, SeqOutput


class Lane:
    """Writes the outputs whose text is not in `refuse`; records what it wrote."""

    def __init__(self, refuse: set[str] = frozenset()):  # type: ignore[assignment]
        self.refuse, self.wrote, self.paid = refuse, [], 0

    def offer(self, output: SeqOutput) -> bool:
        if output.finish_reason is not None or output.text in self.refuse:
            return False
        self.wrote.append(output.text)
        return True


def seq(lane: Any) -> Sequence:
    return cast(Sequence, SimpleNamespace(holding=False, lane=lane, passed=[], t_released=None))


def out(text: str, token: int = 1) -> SeqOutput:
    return SeqOutput(text, (token,))


def test_what_the_lane_writes_is_told_merged_before_the_next_it_declines() -> None:
    s, counters = seq(Lane(refuse={"c"})), StepCounters()
    assert handed(s, out("a", 1), 0.0, counters) == []
    assert handed(s, out("b", 2), 0.1, counters) == []
    told = handed(s, out("c", 3), 0.2, counters)
    assert [(o.text, o.token_ids, o.lane) for o in told] == [
        ("ab", (1, 2), WRITTEN),
        ("c", (3,), DECLINED),
    ]
    assert s.lane.wrote == ["a", "b"] and counters.num_lane_writes == 2
    end = SeqOutput("", (), finish_reason=FinishReason.STOP, num_output_tokens=3)
    assert [(o.lane, o.finish_reason) for o in handed(s, end, 0.3, counters)] == [
        (DECLINED, FinishReason.STOP)
    ]


def test_the_reader_is_told_at_least_every_hold_period() -> None:
    s, counters = seq(Lane()), StepCounters()
    assert handed(s, out("a"), 10.0, counters) == []
    assert handed(s, out("b"), 10.0 + HOLD_S / 2, counters) == []
    told = handed(s, out("c"), 10.0 + HOLD_S, counters)
    assert [(o.text, o.lane) for o in told] == [("abc", WRITTEN)]
    assert handed(s, out("d"), 10.0 + HOLD_S * 1.5, counters) == []  # the clock restarted


def test_a_lane_that_fails_is_dropped_and_the_loop_sends_the_rest() -> None:
    class Broken(Lane):
        def offer(self, output: SeqOutput) -> bool:
            if output.text == "b":
                raise RuntimeError("a bug")
            return super().offer(output)

    s, counters = seq(Broken()), StepCounters()
    assert handed(s, out("a"), 0.0, counters) == []
    told = handed(s, out("b"), 0.1, counters)
    assert [(o.text, o.lane) for o in told] == [("a", WRITTEN), ("b", DECLINED)]
    assert s.lane is None
    c = out("c")
    assert handed(s, c, 0.2, counters) == [c]


def test_without_a_lane_an_output_goes_as_it_is() -> None:
    o = out("a")
    assert handed(seq(None), o, 0.0, StepCounters()) == [o]


async def test_the_reader_reads_written_and_declined_outputs_apart_and_pays_the_lane() -> None:
    opened: list[tuple[str, Any]] = []
    gen = Generation(["r0"], lambda ids: None, open_lane=lambda rid, lane: opened.append((rid, lane)))
    lane = Lane()
    gen.open_lane(lane)
    assert opened == [("r0", lane)]
    written = SeqOutput("ab", (1, 2), lane=WRITTEN)
    declined = SeqOutput("c", (3,), lane=DECLINED)
    for o in (written, declined, SeqOutput("d", (4,), lane=DECLINED)):
        gen.put(0, o)
    first = gen._take()
    assert first[1] is written
    assert gen.ready_nowait(written=True) == []  # a declined one is next: not merged in
    assert [o.text for _, o in gen.ready_nowait()] == ["c", "d"]
    assert lane.paid == 0  # not before the reader has sent them and waits again
    waiting = asyncio.ensure_future(gen._wait())
    await asyncio.sleep(0)
    assert lane.paid == 2
    gen.put(0, SeqOutput("", (), finish_reason=FinishReason.STOP, lane=DECLINED))
    await waiting


def test_a_lane_opens_only_on_one_running_sequence() -> None:
    opened: list[str] = []
    two = Generation(["r0", "r1"], lambda ids: None, open_lane=lambda rid, lane: opened.append(rid))
    two.open_lane(Lane())
    one = Generation(["r0"], lambda ids: None, open_lane=lambda rid, lane: opened.append(rid))
    one.put(0, SeqOutput("", (), finish_reason=FinishReason.STOP))
    one._take()
    one.open_lane(Lane())
    assert opened == []
