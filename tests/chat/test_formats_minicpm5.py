"""MiniCPM5's `<function name=..><param name=..>` calls and `<think>` thinking, against
the cases of llama.cpp's tests/test-chat.cpp (the openbmb-MiniCPM5-1B.jinja block): the
plan's parser fed whole and in pieces, the grammars checked by llama.cpp's own grammar
engine (tests/chat/gbnf_check.py), past calls rendered through the template. Not ported:
the continuation case (an assistant prefill continues as plain text here)."""

from __future__ import annotations

from typing import Any

import pytest

from chat.formats_minicpm5 import MINICPM5
from chat.plan import ChatOptions, plan_chat
from chat.reasoning import THINK, thinking_syntax
from chat.tools import Tool, ToolChoice
from tests.chat import llama_tools as T
from tests.chat.gbnf_check import accepts
from tests.chat.llama_cases import (
    HELLO,
    TEMPLATES,
    USER,
    Calls,
    ParseCase,
    assert_renders,
    detected,
    parser_test,
    past_calls,
    required_accepts,
    template,
    truncated,
)

CPM = "openbmb-MiniCPM5-1B.jinja"


def call(name: str, *params: tuple[str, str]) -> str:
    body = "".join(f'<param name="{k}">{v}</param>' for k, v in params)
    return f'<function name="{name}">{body}</function>'


def case(
    name: str, thinking: bool, tools: list[Tool], text: str, reasoning: str, content: str,
    calls: Calls, reasoning_format: str = "auto",
) -> ParseCase:  # fmt: skip
    options = {"reasoning_format": reasoning_format,
               "template_kwargs": {"enable_thinking": thinking}}  # fmt: skip
    return ParseCase(name, CPM, tools, text, reasoning, content, calls, options)


PY_X = call("python", ("code", "print('x')"))
PY_Y = call("python", ("code", "print('y')"))
MARKUP = '<![CDATA[<a href="/x">hi</a> </param>]]>'

# (the test-chat.cpp case, enable_thinking, tools, output, reasoning, content, calls)
ROWS: list[tuple[Any, ...]] = [
    ("content", False, [], HELLO, "", HELLO, []),
    ("a call", False, [T.python_tool], call("python", ("code", "print('Hello, World!')")), "",
     "", [("python", {"code": "print('Hello, World!')"})]),
    ("no arguments", False, [T.empty_args_tool], call("empty_args"), "", "",
     [("empty_args", {})]),
    ("one call, parallel on", False, [T.python_tool], PY_X, "", "",
     [("python", {"code": "print('x')"})]),
    ("CDATA", False, [T.html_tool], call("html", ("markup", MARKUP)), "", "",
     [("html", {"markup": '<a href="/x">hi</a> </param>'})]),
    ("reasoning and a call", True, [T.python_tool],
     "I'm thinking</think>" + call("python", ("code", "print('hey')")), "I'm thinking", "",
     [("python", {"code": "print('hey')"})]),
    ("parallel calls", False, [T.python_tool], PY_X + "\n" + PY_Y, "", "",
     [("python", {"code": "print('x')"}), ("python", {"code": "print('y')"})]),
    # kvserve's own: typed values, content before a call, no tools, reasoning_format none
    ("typed values", False, [T.magic_int_tool], call("magic_int", ("ref", "42"), ("name", "7")),
     "", "", [("magic_int", {"ref": 42, "name": "7"})]),
    ("content before a call", False, [T.python_tool], "Sure.\n" + PY_X, "", "Sure.",
     [("python", {"code": "print('x')"})]),
    ("no tools offered", False, [], PY_X, "", PY_X, []),
    ("reasoning_format none", True, [], "hm</think>" + HELLO, "", "hm</think>" + HELLO, [],
     "none"),
]  # fmt: skip
CASES = [case(*row) for row in ROWS]


test_parser_matches_llama_cpp = parser_test(CASES, steps=(1, 5, 100_000))


def test_a_cut_off_call_counts_as_truncated() -> None:
    assert (
        truncated(CPM, [T.python_tool], 'Sure.<function name="python"><param name="code">pr') == 1
    )


TOOLS = [T.python_tool, T.html_tool, T.magic_int_tool, T.empty_args_tool]


@pytest.mark.parametrize("text", [
    PY_X,
    PY_X + "\n" + PY_Y,
    call("html", ("markup", MARKUP)),
    call("html", ("markup", "<b>plain</b>")),
    call("magic_int", ("ref", "42")),
    call("magic_int", ("ref", "1"), ("name", "x")),
    call("empty_args"),
    "<think>plan</think>\n\n" + PY_X,
])  # fmt: skip
def test_required_grammar_accepts_calls(text: str) -> None:
    assert required_accepts(MINICPM5, TOOLS, text)


@pytest.mark.parametrize("text", [
    call("magic_int", ("ref", "x")),  # not an integer
    call("python"),  # the required argument left out
    call("other", ("code", "1")),  # not offered
    call("python", ("cmd", "1")),  # not a parameter
    call("python", ("code", "a</param>b")),  # raw text ends at the first </param>
    call("magic_int", ("name", "x"), ("ref", "1")),  # kvserve's: optional after required
    HELLO + PY_X,  # text before a forced call
])  # fmt: skip
def test_required_grammar_rejects_malformed_calls(text: str) -> None:
    assert not required_accepts(MINICPM5, TOOLS, text)


def test_lazy_grammar_and_parallel_off() -> None:
    spec = MINICPM5.grammar(TOOLS, ToolChoice("auto"), parallel=False)
    assert spec.lazy and "(<function)" in spec.trigger_patterns[0]
    assert accepts(spec.gbnf, PY_X)
    assert not accepts(spec.gbnf, PY_X + "\n" + PY_Y)


def test_detection_and_thinking_syntax() -> None:
    assert detected(CPM) is MINICPM5
    assert thinking_syntax((TEMPLATES / CPM).read_text()) is THINK
    opts = ChatOptions(template_kwargs={"enable_thinking": True})
    assert plan_chat(template(CPM), USER, opts).reasoning_inside


def test_past_calls_render_as_the_grammar_writes_them() -> None:
    messages = past_calls([("python", '{"code": "print(1)"}', "ok"),
                           ("html", '{"markup": "<b>x</b>"}', "fine")])  # fmt: skip
    rendered = (call("python", ("code", "print(1)")) + "\n"
                + call("html", ("markup", "<![CDATA[<b>x</b>]]>")))  # fmt: skip
    assert_renders(CPM, messages, tuple(TOOLS), rendered, MINICPM5)
