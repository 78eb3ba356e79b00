"""ByteDance Seed-OSS's `<seed:tool_call>` calls and `<seed:think>` thinking, against the
cases of llama.cpp's tests/test-chat.cpp (the ByteDance-Seed-OSS block, which its
autoparser reads): the plan's parser fed whole and in pieces, the grammars checked by
llama.cpp's own grammar engine, past calls rendered through the template.
Not ported: the two continuation cases (an assistant prefill continues as plain text)."""

from __future__ import annotations

from typing import Any

import pytest

from chat.formats_xml import SEED_OSS
from chat.tools import ToolChoice
from tests.chat import llama_tools as T
from tests.chat.llama_cases import (
    HELLO,
    SPECIAL,
    ParseCase,
    assert_renders,
    cases,
    detected,
    parser_test,
    past_calls,
    required_accepts,
)

SEED = "ByteDance-Seed-OSS.jinja"


def call(name: str, *params: tuple[str, str]) -> str:
    body = "".join(f"<parameter={k}>{v}</parameter>\n" for k, v in params)
    return f"<seed:tool_call>\n<function={name}>\n{body}</function>\n</seed:tool_call>"


TODOS = '[{"item": "Check stuff", "selected": false}, {"item": "Prepare stuff", "selected": true}]'
OLD, NEW = 'def foo(arg = "14"):\n    return arg + "bar"\n', 'def foo(arg = "15"):\n    pass\n'

# (the test-chat.cpp case, tools, output, reasoning, content, calls)
ROWS: list[tuple[Any, ...]] = [
    ("content", [], HELLO, "", HELLO, []),
    ("reasoning and content", [],
     "<seed:think>I'm thinking about the answer</seed:think>\nHello, world!",
     "I'm thinking about the answer", "Hello, world!", []),
    ("a call", [T.special_function_tool], call("special_function", ("arg1", "1")), "", "",
     SPECIAL),
    ("parallel calls", [T.special_function_tool, T.special_function_tool_with_optional_param],
     call("special_function", ("arg1", "1")) + "\n"
     + call("special_function_with_opt", ("arg1", "1"), ("arg2", "2")), "", "",
     [("special_function", {"arg1": 1}), ("special_function_with_opt", {"arg1": 1, "arg2": 2})]),
    ("an array value", [T.todo_list], call("todo_list", ("todos", TODOS)), "", "",
     [("todo_list", {"todos": [{"item": "Check stuff", "selected": False},
                               {"item": "Prepare stuff", "selected": True}]})]),
    ("a call with quotes inside", [T.edit_tool],
     call("edit", ("filename", "foo.cpp"), ("oldString", OLD), ("newString", NEW)), "", "",
     [("edit", {"filename": "foo.cpp", "oldString": OLD, "newString": NEW})]),
    # kvserve's own: thinking then a call, text before a call, a call cut off
    ("thinking then a call", [T.get_time_tool],
     "<seed:think>Paris?</seed:think>\n" + call("get_time", ("city", "Paris")), "Paris?", "",
     [("get_time", {"city": "Paris"})]),
    ("text then a call", [T.get_time_tool], "Sure.\n" + call("get_time", ("city", "Paris")),
     "", "Sure.", [("get_time", {"city": "Paris"})]),
    ("a call cut off", [T.get_time_tool],
     "<seed:tool_call>\n<function=get_time>\n<parameter=city>Par", "", "", []),
]  # fmt: skip
CASES = cases(SEED, ROWS, eos="<seed:eos>")


test_parser_matches_llama_cpp = parser_test(CASES, steps=(1, 5, 100_000))


def test_reasoning_format_none_leaves_the_thinking_in_the_content() -> None:
    text = "<seed:think>hm</seed:think>\nHello"
    ParseCase("none", SEED, [], text, "", text, [], {"reasoning_format": "none"}).check(3)


TWO = [T.get_time_tool, T.magic_int_tool]


@pytest.mark.parametrize("text", [
    call("get_time", ("city", "Paris")),
    "<seed:think>which city?</seed:think>\n" + call("get_time", ("city", "Paris")),
    call("magic_int", ("ref", "1"), ("name", "x")) + "\n" + call("get_time", ("city", "a\nb")),
])  # fmt: skip
def test_required_grammar_accepts_calls(text: str) -> None:
    assert required_accepts(SEED_OSS, TWO, text)


@pytest.mark.parametrize("text", [
    call("magic_int", ("ref", "x"), ("name", "x")),  # not an integer
    call("magic_int", ("name", "x")),  # the required one left out
    call("other", ("city", "x")),  # not offered
    HELLO + call("get_time", ("city", "Paris")),  # text before a forced call
    "<tool_call>\n<function=get_time>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
    "</tool_call>",  # Qwen3-Coder's tags
])  # fmt: skip
def test_required_grammar_rejects_malformed_calls(text: str) -> None:
    assert not required_accepts(SEED_OSS, TWO, text)


def test_lazy_grammar_and_detection() -> None:
    spec = SEED_OSS.grammar(TWO, ToolChoice("auto"), parallel=False)
    assert spec.lazy and "seed:tool_call" in spec.trigger_patterns[0]
    assert detected(SEED) is SEED_OSS
    assert SEED_OSS.owns_reasoning


def test_past_calls_render_as_the_grammar_writes_them() -> None:
    messages = past_calls([("magic_int", '{"ref": 42, "name": "foo bar"}', "ok"),
                           ("get_time", '{"city": "Paris"}', "sunny")])  # fmt: skip
    rendered = (call("magic_int", ("ref", "42"), ("name", "foo bar")) + "\n"
                + call("get_time", ("city", "Paris")))  # fmt: skip
    text = assert_renders(SEED, messages, tuple(TWO), rendered, SEED_OSS, eos="<seed:eos>")
    assert "<seed:bos>tool\nok<seed:eos>" in text
