"""Functionary v3.2's `>>>RECIPIENT` messages, against the cases of llama.cpp's
tests/test-chat.cpp (its block for meetkai-functionary-medium-v3.2.jinja; the
continuation case is left out: kvserve continues no final message into a call) and
kvserve's own (parallel calls, content before a call, as the template writes them): the
plan's parser fed whole and one character at a time, the grammars checked by llama.cpp's
own grammar engine (tests/chat/gbnf_check.py), past calls rendered through the template."""

from __future__ import annotations

import json
import re

import pytest

from chat.formats_functionary import FUNCTIONARY_V3_2
from chat.plan import ChatOptions, plan_chat
from chat.tools import ToolChoice
from tests.chat import llama_tools as T
from tests.chat.gbnf_check import accepts
from tests.chat.llama_cases import (
    HELLO,
    SPECIAL,
    USER,
    assert_renders,
    cases,
    detected,
    parser_test,
    past_calls,
    template,
    truncated,
)

NAME = "meetkai-functionary-medium-v3.2.jinja"
PARIS = '{"city": "Paris"}'
ROWS = [
    # test-chat.cpp's
    ("content", [], "all\n" + HELLO, "", HELLO, []),
    ("a call", [T.special_function_tool], 'special_function\n{"arg1": 1}', "", "", SPECIAL),
    # kvserve's: the template's own writing of several messages
    ("content with tools offered", [T.special_function_tool], "all\n" + HELLO, "", HELLO, []),
    ("content, then a call", [T.get_time_tool], f"all\nLet me look.>>>get_time\n{PARIS}", "",
     "Let me look.", [("get_time", {"city": "Paris"})]),
    ("parallel calls", [T.get_time_tool, T.get_weather_tool],
     f"get_time\n{PARIS}>>>get_weather\n{PARIS}", "", "",
     [("get_time", {"city": "Paris"}), ("get_weather", {"city": "Paris"})]),
    ("a recipient not offered stays content", [T.get_time_tool], f"python\n{PARIS}", "",
     f"python\n{PARIS}", []),
    ("not the format", [T.get_time_tool], "Hello", "", "Hello", []),
]  # fmt: skip


test_parser_matches_llama_cpp = parser_test(cases(NAME, ROWS), steps=(1, 3, 100_000))


def test_detection() -> None:
    assert detected(NAME) is FUNCTIONARY_V3_2
    assert detected("meetkai-functionary-medium-v3.1.jinja") is not FUNCTIONARY_V3_2


def test_the_prompt_ends_with_the_first_recipients_arrow() -> None:
    plan = plan_chat(template(NAME), USER, ChatOptions(tools=(T.get_time_tool,)))
    assert plan.prompt.text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n>>>")


@pytest.mark.parametrize("parallel", [True, False])
def test_forced_grammar_is_the_calls_alone(parallel: bool) -> None:
    tools = [T.get_time_tool, T.get_weather_tool]
    spec = FUNCTIONARY_V3_2.grammar(tools, ToolChoice("required"), parallel)
    assert not spec.lazy
    assert accepts(spec.gbnf, f"get_time\n{PARIS}")
    assert accepts(spec.gbnf, f"get_time\n{PARIS}>>>get_weather\n{PARIS}") is parallel
    for bad in (
        f"all\nSure.>>>get_time\n{PARIS}",  # an `all` message before a forced call
        f"get_date\n{PARIS}",  # not offered
        'get_time\n{"city": 1}',  # a string given a number
        f"get_time {PARIS}",  # the recipient's line break
    ):
        assert not accepts(spec.gbnf, bad), bad


def test_auto_grammar_arms_at_an_offered_name() -> None:
    spec = FUNCTIONARY_V3_2.grammar([T.get_time_tool], ToolChoice("auto"), True)
    assert spec.lazy
    (pattern,) = spec.trigger_patterns
    for text, start in ((f"get_time\n{PARIS}", 0),
                        (f"all\nLet me look.>>>get_time\n{PARIS}", 19)):  # fmt: skip
        # as engine/grammar.py's LazyTrigger: the output so far, the grammar from group 1
        found = next(m for end in range(len(text) + 1) if (m := re.fullmatch(pattern, text[:end])))
        assert found.start(1) == start and accepts(spec.gbnf, text[start:])
    for text in ("all\n" + HELLO, "all\nget_time\nis a tool", "get_times\n"):
        assert not any(re.fullmatch(pattern, text[:end]) for end in range(len(text) + 1)), text


def test_auto_with_a_response_schema_is_calls_or_the_document() -> None:
    doc = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    spec = FUNCTIONARY_V3_2.grammar([T.get_time_tool], ToolChoice("auto"), True, doc)
    assert not spec.lazy
    assert accepts(spec.gbnf, 'all\n{"answer": "hi"}') and accepts(spec.gbnf, f"get_time\n{PARIS}")
    assert not accepts(spec.gbnf, 'all\n{"other": 1}')


def test_a_call_cut_off_is_not_reported() -> None:
    assert truncated(NAME, [T.get_time_tool], 'get_time\n{"city": "Pa') == 1


def test_past_calls_render_as_the_grammar_writes_them() -> None:
    # the template joins `arguments` as text: they reach it as the mapping's JSON text
    history = past_calls([("get_weather", PARIS, "sunny"), ("get_time", json.dumps({"city": "Paris"}),
                                                           "noon")])  # fmt: skip
    rendered = f">>>get_weather\n{PARIS}>>>get_time\n{PARIS}<|eot_id|>"
    text = assert_renders(NAME, history, (T.get_weather_tool, T.get_time_tool),
                          rendered.removeprefix(">>>").removesuffix("<|eot_id|>"),
                          FUNCTIONARY_V3_2)  # fmt: skip
    assert rendered in text
