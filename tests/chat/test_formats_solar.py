"""Upstage Solar Open's assistant messages (`<|think|>`, `<|content|>`, `<|tool_calls|>`),
the syntax llama.cpp's autoparser derives from the template's renders. test-chat.cpp has
no parser case for it (it checks only that the template takes a reasoning effort), so
the cases are kvserve's own, written from the template's renders: the plan's parser fed
whole and in pieces, the grammars checked by llama.cpp's own grammar engine, past calls
rendered through the template as the grammar writes them."""

from __future__ import annotations

from typing import Any

import pytest

from chat.formats_solar import SOLAR_OPEN
from chat.tools import ToolChoice
from tests.chat import llama_tools as T
from tests.chat.llama_cases import (
    HELLO,
    SPECIAL,
    assert_renders,
    cases,
    detected,
    parser_test,
    past_calls,
    required_accepts,
)

SOLAR = "upstage-Solar-Open-100B.jinja"
BOTH = [T.get_time_tool, T.magic_int_tool]


def calls(*items: tuple[str, str, str]) -> str:
    body = "".join(
        f"<|tool_call:begin|>{i}<|tool_call:name|>{name}<|tool_call:args|>{args}<|tool_call:end|>"
        for i, name, args in items
    )
    return f"<|tool_calls|>{body}<|calls|>"


THOUGHT = "<|think|>I'm\nthinking<|end|><|begin|>assistant"
TIME = ("c2", "get_time", '{"city": "Paris"}')
# (name, tools, output, reasoning, content, calls[, reasoning_format])
ROWS: list[tuple[Any, ...]] = [
    ("content", [], f"<|content|>{HELLO}<|end|>", "", HELLO, []),
    ("thinking and content", [], f"{THOUGHT}<|content|>{HELLO}<|end|>", "I'm\nthinking", HELLO,
     []),
    ("a call", [T.special_function_tool], calls(("1", "special_function", '{"arg1": 1}')), "", "",
     SPECIAL),
    ("thinking, text and two calls", BOTH,
     f"{THOUGHT}<|content|>Sure.<|end|><|begin|>assistant"
     + calls(("a1", "magic_int", '{"ref": 1, "name": "x"}'), TIME), "I'm\nthinking", "Sure.",
     [("magic_int", {"ref": 1, "name": "x"}), ("get_time", {"city": "Paris"})]),
    ("a call cut off", BOTH, '<|tool_calls|><|tool_call:begin|>c<|tool_call:name|>get_time'
     '<|tool_call:args|>{"city": "Pa', "", "", []),
    ("calls without tools stay content", [], calls(TIME), "", calls(TIME), []),
    ("thinking kept with reasoning_format none", [], f"{THOUGHT}<|content|>{HELLO}<|end|>", "",
     f"<|think|>I'm\nthinking{HELLO}", [], "none"),
]  # fmt: skip
CASES = cases(SOLAR, ROWS)


test_parser = parser_test(CASES, steps=(1, 6, 100_000))


@pytest.mark.parametrize("text", [
    calls(TIME),
    f"{THOUGHT}" + calls(("a", "magic_int", '{"ref": 1, "name": "x"}'), TIME),
])  # fmt: skip
def test_required_grammar_accepts_calls(text: str) -> None:
    assert required_accepts(SOLAR_OPEN, BOTH, text)


@pytest.mark.parametrize("text", [
    calls(("a", "magic_int", '{"ref": "x", "name": "x"}')),  # not an integer
    calls(("a", "other", "{}")),  # not offered
    calls(("", "get_time", '{"city": "Paris"}')),  # no id
    f"<|content|>{HELLO}<|end|><|begin|>assistant" + calls(TIME),  # an answer before a forced call
])  # fmt: skip
def test_required_grammar_rejects_malformed_calls(text: str) -> None:
    assert not required_accepts(SOLAR_OPEN, BOTH, text)


def test_lazy_grammar_and_detection() -> None:
    spec = SOLAR_OPEN.grammar(BOTH, ToolChoice("auto"), parallel=False)
    assert spec.lazy and spec.trigger_words == ("<|tool_calls|>",)
    assert detected(SOLAR) is SOLAR_OPEN


def test_past_calls_render_as_the_grammar_writes_them() -> None:
    messages = past_calls([("magic_int", '{"ref": 42, "name": "foo bar"}', "ok"),
                           ("get_time", '{"city": "Paris"}', "sunny")])  # fmt: skip
    rendered = calls(("c1", "magic_int", '{"ref": 42, "name": "foo bar"}'), TIME)
    text = assert_renders(SOLAR, messages, tuple(BOTH), rendered, SOLAR_OPEN)
    assert "<|tool_response:begin|>c2<|tool_response:name|>get_time" in text
