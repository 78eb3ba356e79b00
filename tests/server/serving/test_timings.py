"""llama-server's `timings` object from a reply's choices (server/serving/timings.py)."""

from __future__ import annotations

import json

import pytest

from engine.client import FinishReason, Timings
from server.serving.state import Choice
from server.serving.timings import timings, with_timings


def finished(num_output: int, cached: int, t: Timings) -> Choice:
    return Choice(finish_reason=FinishReason.STOP, num_output_tokens=num_output,
                  num_cached_tokens=cached, timings=t)  # fmt: skip


def test_one_choice_by_llama_servers_rules() -> None:
    t = Timings(arrival=9.0, scheduled=10.0, prompt_done=10.5, first_token=10.5, finished=12.5)
    out = timings([finished(5, 20, t)], num_prompt_tokens=100)
    assert out == {
        "cache_n": 20,
        "prompt_n": 80,  # computed: the prompt less what the cache gave
        "prompt_ms": pytest.approx(500.0),  # from its first step, not its arrival
        "prompt_per_token_ms": pytest.approx(6.25),
        "prompt_per_second": pytest.approx(160.0),
        "predicted_n": 5,
        "predicted_ms": pytest.approx(2000.0),
        # the first token came from the prompt's step: 4 decode steps in 2 s
        "predicted_per_token_ms": pytest.approx(500.0),
        "predicted_per_second": pytest.approx(2.0),
    }


def test_choices_together_and_nothing_to_divide() -> None:
    a = Timings(arrival=0.0, scheduled=1.0, prompt_done=2.0, first_token=2.0, finished=3.0)
    b = Timings(arrival=0.0, scheduled=1.0, prompt_done=2.0, first_token=2.0, finished=4.0)
    out = timings([finished(3, 0, a), finished(1, 0, b)], num_prompt_tokens=10)
    assert out is not None
    assert (out["predicted_n"], out["predicted_ms"]) == (4, pytest.approx(2000.0))
    assert out["predicted_per_second"] == pytest.approx(1.0)  # 2 steps past the 2 first tokens
    whole = Timings(arrival=0.0, scheduled=1.0, prompt_done=1.0, first_token=1.0, finished=1.0)
    out = timings([finished(1, 10, whole)], num_prompt_tokens=10)  # all cached, one token
    assert out is not None and out["prompt_n"] == 0 and out["prompt_per_token_ms"] == 0.0
    assert out["predicted_per_token_ms"] == 0.0 and out["predicted_per_second"] == 0.0
    assert timings([Choice(finish_reason=FinishReason.ERROR)], 10) is None  # never timed


def test_with_timings_closes_a_chunk() -> None:
    chunk = json.dumps({"id": "x", "choices": []})
    assert json.loads(with_timings(chunk, {"prompt_n": 1})) == {
        "id": "x", "choices": [], "timings": {"prompt_n": 1}
    }  # fmt: skip
    assert with_timings(chunk, None) == chunk
