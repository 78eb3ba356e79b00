"""A stream's lane on the engine thread (engine/thread/lanes.py) and on the reader's side
(`Generation`): what the lane wrote reaches the reader marked, merged, in order with what
it declined; the lane is offered an output only once the reader has sent every output
handed to it before, those from before the lane opened included."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from engine.loop.generation import Generation
from engine.sequence import Sequence
from engine.thread.holding import HOLD_S
from engine.thread.lanes import handed
from engine.thread.stats import StepCounters
from engine.types import FinishReason, SeqOutput


class Lane:
    """Writes the outputs whose text is not in `refuse`; records what it was offered."""

    def __init__(self, refuse: frozenset[str] = frozenset()):
        self.refuse, self.offered, self.paid = refuse, [], 0

    def offer(self, output: SeqOutput) -> bool:
        self.offered.append(output.text)
        return output.finish_reason is None and output.text not in self.refuse


def seq(lane: Any) -> Sequence:
    return cast(
        Sequence,
        SimpleNamespace(holding=False, lane=lane, passed=[], t_released=None, num_unwritten=0),
    )


def out(text: str, token: int = 1) -> SeqOutput:
    return SeqOutput(text, (token,))


def shown(outputs: list[SeqOutput]) -> list[tuple[str, bool]]:
    return [(o.text, o.written) for o in outputs]


def test_what_the_lane_writes_is_told_merged_before_the_next_it_declines() -> None:
    s, counters = seq(Lane(refuse=frozenset({"c"}))), StepCounters()
    assert handed(s, out("a", 1), 0.0, counters) == []
    assert handed(s, out("b", 2), 0.1, counters) == []
    told = handed(s, out("c", 3), 0.2, counters)
    assert [(o.text, o.token_ids, o.written) for o in told] == [
        ("ab", (1, 2), True),
        ("c", (3,), False),
    ]
    assert counters.num_lane_writes == 2 and s.num_unwritten == 1
    s.lane.paid = 1  # the reader sent "c"
    end = SeqOutput("", (), finish_reason=FinishReason.STOP, num_output_tokens=3)
    assert [(o.written, o.finish_reason) for o in handed(s, end, 0.3, counters)] == [
        (False, FinishReason.STOP)
    ]


def test_nothing_is_offered_while_the_reader_has_outputs_to_send() -> None:
    """Outputs handed before the lane opened, or declined, go out before anything the
    lane writes: until the reader has sent them all, the lane is not even asked."""
    s, counters = seq(None), StepCounters()
    before = [handed(s, out(t), 0.0, counters) for t in ("x", "y")]  # before the lane
    assert before == [[out("x")], [out("y")]] and s.num_unwritten == 2
    s.lane = lane = Lane()
    lane.paid = 1  # the reader has sent "x" only
    assert shown(handed(s, out("a"), 0.1, counters)) == [("a", False)]
    assert lane.offered == [] and s.num_unwritten == 3
    lane.paid = 3
    assert handed(s, out("b"), 0.2, counters) == [] and lane.offered == ["b"]


def test_the_reader_is_told_at_least_every_hold_period() -> None:
    s, counters = seq(Lane()), StepCounters()
    assert handed(s, out("a"), 10.0, counters) == []
    assert handed(s, out("b"), 10.0 + HOLD_S / 2, counters) == []
    told = handed(s, out("c"), 10.0 + HOLD_S, counters)
    assert shown(told) == [("abc", True)]
    assert handed(s, out("d"), 10.0 + HOLD_S * 1.5, counters) == []  # the clock restarted


def test_a_lane_that_fails_is_dropped_and_the_loop_sends_the_rest() -> None:
    class Broken(Lane):
        def offer(self, output: SeqOutput) -> bool:
            if output.text == "b":
                raise RuntimeError("a bug")
            return super().offer(output)

    s, counters = seq(Broken()), StepCounters()
    assert handed(s, out("a"), 0.0, counters) == []
    assert shown(handed(s, out("b"), 0.1, counters)) == [("a", True), ("b", False)]
    assert s.lane is None
    c = out("c")
    assert handed(s, c, 0.2, counters) == [c]


def test_without_a_lane_an_output_goes_as_it_is() -> None:
    o = out("a")
    assert handed(seq(None), o, 0.0, StepCounters()) == [o]


async def test_the_reader_reads_written_outputs_apart_and_pays_the_lane() -> None:
    opened: list[tuple[str, Any]] = []
    gen = Generation(
        ["r0"], lambda ids: None, open_lane=lambda rid, lane: opened.append((rid, lane))
    )
    gen.put(0, SeqOutput("x", (9,)))  # before the lane opened
    gen._take()
    lane = Lane()
    gen.open_lane(lane)
    assert opened == [("r0", lane)]
    written = SeqOutput("ab", (1, 2), written=True)
    for o in (written, SeqOutput("c", (3,)), SeqOutput("d", (4,))):
        gen.put(0, o)
    assert gen._take()[1] is written
    assert gen.ready_nowait(written=True) == []  # an unwritten one is next: not merged in
    assert [o.text for _, o in gen.ready_nowait()] == ["c", "d"]
    assert lane.paid == 0  # not before the reader has sent them and waits again
    waiting = asyncio.ensure_future(gen._wait())
    await asyncio.sleep(0)
    assert lane.paid == 3  # "x", "c" and "d"; not what the lane wrote
    gen.put(0, SeqOutput("", (), finish_reason=FinishReason.STOP))
    await waiting


def test_a_lane_opens_only_on_one_running_sequence() -> None:
    opened: list[str] = []

    def note(rid: str, lane: Any) -> None:
        opened.append(rid)

    two = Generation(["r0", "r1"], lambda ids: None, open_lane=note)
    two.open_lane(Lane())
    one = Generation(["r0"], lambda ids: None, open_lane=note)
    one.put(0, SeqOutput("", (), finish_reason=FinishReason.STOP))
    one._take()
    one.open_lane(Lane())
    assert opened == []
