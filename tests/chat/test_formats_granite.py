"""Granite 3.3's `<|tool_call|>` list: llama.cpp's cases for the template
(test-chat.cpp: content, and `<think>` split), and kvserve's own for the calls its
template asks for (llama.cpp parses none for this template): the plan's parser fed whole
and one character at a time, the grammars checked by llama.cpp's grammar engine, past
calls written into the turn's content as the grammar writes them."""

from __future__ import annotations

import pytest

from chat.formats import GRANITE
from chat.tools import ToolChoice
from tests.chat import llama_tools as T
from tests.chat.gbnf_check import accepts
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

G33 = "ibm-granite-granite-3.3-2B-Instruct.jinja"
CALL = '<|tool_call|>[{"name": "special_function", "arguments": {"arg1": 1}}]'
TWO = (
    '<|tool_call|>[{"name": "special_function", "arguments": {"arg1": 1}}, '
    '{"name": "python", "arguments": {"code": "print(1)"}}]'
)
CASES = cases(None, [
    ("content", G33, [], HELLO, "", HELLO, []),
    ("thinking (reasoning_format deepseek)", G33, [], f"<think>I'm\nthinking</think>{HELLO}",
     "I'm\nthinking", HELLO, []),
    ("kvserve: a call", G33, [T.special_function_tool], CALL, "", "", SPECIAL),
    ("kvserve: text, then two calls", G33, [T.special_function_tool, T.python_tool],
     "Sure. " + TWO, "", "Sure.", [*SPECIAL, ("python", {"code": "print(1)"})]),
])  # fmt: skip


test_parser = parser_test(CASES, steps=(1, 7, 100_000))


@pytest.mark.parametrize("text", [CALL, TWO, CALL.replace(", ", ",")])
def test_required_grammar_accepts_calls(text: str) -> None:
    assert required_accepts(GRANITE, [T.special_function_tool, T.python_tool], text)


@pytest.mark.parametrize("text", [
    CALL.replace('"arg1": 1', '"arg1": "x"'), CALL.replace("<|tool_call|>", ""),
    CALL.replace("special_function", "other"), HELLO,
])  # fmt: skip
def test_required_grammar_rejects_malformed_calls(text: str) -> None:
    assert not required_accepts(GRANITE, [T.special_function_tool, T.python_tool], text)


def test_lazy_grammar() -> None:
    spec = GRANITE.grammar([T.special_function_tool], ToolChoice("auto"), parallel=False)
    assert spec.lazy and spec.trigger_words == ("<|tool_call|>",)
    assert accepts(spec.gbnf, CALL) and not accepts(spec.gbnf, TWO)


def test_detection() -> None:
    assert detected(G33) is GRANITE
    assert detected("ibm-granite-granite-4.0.jinja").name == "hermes"


def test_past_calls_render_into_the_content() -> None:
    """The template writes a turn's content alone: the calls are written there."""
    messages = past_calls([("special_function", '{"arg1": 1}', "ok"),
                           ("python", '{"code": "print(1)"}', "1")])  # fmt: skip
    tools = (T.special_function_tool, T.python_tool)
    text = assert_renders(G33, messages, tools, TWO, GRANITE)
    assert "<|start_of_role|>assistant<|end_of_role|>" + TWO + "<|end_of_text|>" in text
