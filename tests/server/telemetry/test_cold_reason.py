"""The access record says why a request that found a stored prefix computed cold (issue
49): the engine's Timings.cold_reason on the final output becomes the access line's
`cold_reason`; a warm request, or a cold one with nothing found, has none."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from engine.types import FinishReason, SeqOutput, Timings
from server.telemetry.access import AccessRecord


def final(hit_kind: str, cold_reason: str) -> SeqOutput:
    timings = Timings(0.0, cold_reason=cold_reason)
    return SeqOutput("", (), finish_reason=FinishReason.STOP, hit_kind=hit_kind, timings=timings)


def fields_after(out: SeqOutput) -> dict[str, Any]:
    record = AccessRecord("r", "POST", "/v1/completions")
    generation: Any = SimpleNamespace(session_id=None)
    record.generations.append(generation)
    record.observe(generation, 0, out)
    return record.fields()


def test_a_cold_request_that_found_a_prefix_says_why() -> None:
    fields = fields_after(final("cold", "exact_tail"))
    assert fields["cache_hit"] == "cold" and fields["cold_reason"] == "exact_tail"


def test_no_reason_where_there_is_none_to_give() -> None:
    assert fields_after(final("cold", ""))["cold_reason"] is None
    assert fields_after(final("partial", ""))["cold_reason"] is None
