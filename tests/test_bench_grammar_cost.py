"""bench/grammar_cost.py without a server: the twins differ only by the grammar, the rate
is read from `timings` and short replies are not timed, the cost is per token."""

from __future__ import annotations

import json

import pytest

from bench.grammar_cost import MIN_TIMED, cases, catalogue, cost_ms, rate


def test_each_case_has_a_grammar_and_a_plain_twin() -> None:
    both = cases(128)
    schema, plain = both["schema"]
    assert schema["response_format"]["type"] == "json_schema" and "response_format" not in plain
    assert plain["ignore_eos"] and "ignore_eos" not in schema  # the plain twin runs to the end
    tools, plain = both["tools"]
    assert tools["tool_choice"] == "required" and len(tools["tools"]) == 40
    assert "tools" not in plain
    # the plain twin attends over the catalogue too: its JSON as a system message
    assert json.loads(plain["messages"][0]["content"]) == tools["tools"]
    assert plain["messages"][1:] == tools["messages"]


def test_the_catalogue_names_are_distinct() -> None:
    names = [t["function"]["name"] for t in catalogue(40)]
    assert len(set(names)) == 40


def test_rate_reads_timings_and_skips_short_replies() -> None:
    reply = {"timings": {"predicted_n": 100, "predicted_per_second": 50.0}}
    assert rate(reply, 128) == 50.0
    short = {"timings": {"predicted_n": MIN_TIMED - 1, "predicted_per_second": 50.0}}
    assert rate(short, 128) is None
    assert rate({}, 128) is None


def test_cost_is_the_time_a_token_the_grammar_adds() -> None:
    assert cost_ms(100.0, 125.0) == pytest.approx(2.0)
    assert cost_ms(125.0, 125.0) == 0.0
