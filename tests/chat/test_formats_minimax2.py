"""MiniMax-M2's `<minimax:tool_call>` calls, against the cases of llama.cpp's
tests/test-chat.cpp (the MiniMax-M2 block, which its autoparser reads): the plan's parser
fed whole and in pieces (the `<think>` the prompt opens split by the plan), the grammars
checked by llama.cpp's own grammar engine, past calls rendered through the template.
Not ported: the two continuation cases (an assistant prefill continues as plain text)."""

from __future__ import annotations

import pytest

from chat.formats_minimax2 import MINIMAX_M2
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

M2 = "MiniMax-M2.jinja"


def invoke(name: str, *params: tuple[str, str]) -> str:
    body = "".join(f'<parameter name="{k}">{v}</parameter>\n' for k, v in params)
    return f'<invoke name="{name}">\n{body}</invoke>\n'


def block(*calls: str) -> str:
    return "<minimax:tool_call>\n" + "".join(calls) + "</minimax:tool_call>"


# (the test-chat.cpp case, tools, output, reasoning, content, calls)
CASES = cases(M2, [
    ("content", [], "\n</think>\n\n" + HELLO, "", HELLO, []),
    ("reasoning and content", [], "I'm\nthinking\n</think>\n\n" + HELLO, "I'm\nthinking", HELLO,
     []),
    ("reasoning and a call without arguments", [T.empty_args_tool],
     "Let's call a tool:\n</think>\n\n" + block(invoke("empty_args")), "Let's call a tool:", "",
     [("empty_args", {})]),
    ("a call", [T.special_function_tool],
     "\n</think>\n\n" + block(invoke("special_function", ("arg1", "1"))), "", "", SPECIAL),
    # kvserve's own: parallel calls, typed values, text before the block, a cut-off call
    ("parallel calls and types", [T.magic_int_tool, T.get_time_tool],
     "\n</think>\n\nSure." + block(invoke("magic_int", ("ref", "-3"), ("name", "12")),
                                   invoke("get_time", ("city", "Paris"))),
     "", "Sure.", [("magic_int", {"ref": -3, "name": "12"}), ("get_time", {"city": "Paris"})]),
    ("a call cut off", [T.get_time_tool], "\n</think>\n\n" + '<minimax:tool_call>\n<invoke '
     'name="get_time">\n<parameter name="city">Par', "", "", []),
])  # fmt: skip


test_parser_matches_llama_cpp = parser_test(CASES, steps=(1, 6, 100_000))


TWO = [T.get_time_tool, T.magic_int_tool]


@pytest.mark.parametrize("text", [
    block(invoke("get_time", ("city", "Paris"))),
    "hm\n</think>\n\n" + block(invoke("get_time", ("city", "Paris"))),
    block(invoke("magic_int", ("ref", "1"), ("name", "x")), invoke("get_time", ("city", "a"))),
    '<minimax:tool_call><invoke name="magic_int"><parameter name="ref">1</parameter></invoke>'
    "</minimax:tool_call>",
])  # fmt: skip
def test_required_grammar_accepts_calls(text: str) -> None:
    assert required_accepts(MINIMAX_M2, TWO, text)


@pytest.mark.parametrize("text", [
    block(invoke("magic_int", ("ref", "x"))),  # not an integer
    block(invoke("magic_int", ("name", "x"))),  # the required one left out
    block(invoke("other", ("city", "x"))),  # not offered
    HELLO + block(invoke("get_time", ("city", "Paris"))),  # text before a forced call
])  # fmt: skip
def test_required_grammar_rejects_malformed_calls(text: str) -> None:
    assert not required_accepts(MINIMAX_M2, TWO, text)


def test_lazy_grammar_and_detection() -> None:
    spec = MINIMAX_M2.grammar(TWO, ToolChoice("auto"), parallel=False)
    assert spec.lazy and "minimax:tool_call" in spec.trigger_patterns[0]
    assert detected(M2) is MINIMAX_M2
    assert detected("MiniMax-M1.jinja") is not MINIMAX_M2


def test_past_calls_render_as_the_grammar_writes_them() -> None:
    messages = past_calls([("magic_int", '{"ref": 42, "name": "foo bar"}', "ok")])
    rendered = block(invoke("magic_int", ("ref", "42"), ("name", "foo bar")))
    text = assert_renders(M2, messages, tuple(TWO), rendered, MINIMAX_M2)
    assert "]~b]tool\n<response>ok</response>" in text
