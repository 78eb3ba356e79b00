"""LoRA adapter sets in the scheduler: one set a step, sets take turns, prefixes kept apart."""

from __future__ import annotations

from engine.detokenizer import IncrementalDetokenizer
from engine.sequence import Sequence
from engine.thread.scheduler import Scheduler, SchedulerConfig
from engine.types import GenerateRequest
from tests.engine.test_scheduler import apply

A = (("a", 1.0),)
B = (("b", 0.5),)


def seq(name: str, num_prompt: int, lora: tuple[tuple[str, float], ...] = ()) -> Sequence:
    request = GenerateRequest(name, tuple(range(1, num_prompt + 1)), lora=lora)
    return Sequence(request, None, IncrementalDetokenizer([b""]), None)


def sched(slots: int = 4) -> Scheduler:
    return Scheduler(SchedulerConfig(slots, 1000 * slots, 1000, 64, 32, exact=False))


def test_one_adapter_set_per_step_and_sets_alternate() -> None:
    s = sched()
    s.add(seq("base", 4))
    s.add(seq("a1", 4, A))
    s.add(seq("a2", 4, A))
    s.add(seq("b", 4, B))
    seen = []
    for _ in range(6):
        plan = apply(s)
        loras = {s.find(name).lora for name, *_ in plan}  # type: ignore[union-attr]
        assert len(loras) == 1, plan  # never two sets in one decode
        seen.append(loras.pop())
    # each of the three sets ran, in turns: no set waits two steps behind another
    assert set(seen[:3]) == {(), A, B} and seen[:3] == seen[3:]
    names = {n for n, *_ in apply(s)}
    assert names in ({"base"}, {"a1", "a2"}, {"b"})  # same-set sequences share a batch


def test_a_single_set_is_not_held_back() -> None:
    s = sched()
    for name in ("x", "y"):
        s.add(seq(name, 4, A))
    assert {p[0] for p in apply(s)} == {"x", "y"}


def _finished_in_a_slot(s: Scheduler, lora: tuple[tuple[str, float], ...]) -> None:
    first = seq("first", 100, lora)
    s.add(first)
    while first.num_output_tokens == 0:
        apply(s)
    s.remove(first)  # its 100 prompt tokens stay resident in its slot, under its set


def test_prefixes_are_not_shared_across_adapter_sets() -> None:
    for later, expect_reuse in ((B, False), ((), False), (A, True)):
        s = sched(slots=2)
        _finished_in_a_slot(s, A)
        nxt = seq("next", 100, later)
        s.add(nxt)
        apply(s)
        assert (nxt.num_cached > 0) is expect_reuse, later
        assert nxt.hit_kind == ("exact" if expect_reuse else "cold")


def test_prefix_salt_folds_the_set_in() -> None:
    plain = GenerateRequest("r", (1,), cache_salt="t")
    assert plain.prefix_salt == "t"
    a = GenerateRequest("r", (1,), cache_salt="t", lora=A)
    b = GenerateRequest("r", (1,), cache_salt="t", lora=(("a", 0.5),))
    assert len({plain.prefix_salt, a.prefix_salt, b.prefix_salt}) == 3
