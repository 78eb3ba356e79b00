"""Apertus's `<|tools_prefix|>[{"NAME": {..}}, ..]<|tools_suffix|>` calls, against the
case of llama.cpp's tests/test-chat.cpp (the Apertus-8B-Instruct block, which its
autoparser reads) and kvserve's own: the plan's parser fed whole and in pieces, the
grammars checked by llama.cpp's own grammar engine, past calls rendered through the
template as the grammar writes them. Not ported: the continuation case (an assistant
prefill continues as plain text)."""

from __future__ import annotations

from typing import Any

import pytest

from chat.formats_apertus import APERTUS
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

APERTUS_T = "Apertus-8B-Instruct.jinja"


def calls(*items: str) -> str:
    return "<|tools_prefix|>[" + ", ".join(items) + "]<|tools_suffix|>"


TIME = '{"get_time": {"city": "Paris"}}'
BOTH = [T.get_time_tool, T.magic_int_tool]
# (name, tools, output, reasoning, content, calls)
ROWS: list[tuple[Any, ...]] = [
    ("a call", [T.special_function_tool], calls('{"special_function": {"arg1": 1}}'), "", "",
     SPECIAL),
    # kvserve's own
    ("content", [T.special_function_tool], HELLO, "", HELLO, []),
    ("text and two calls", BOTH,
     "Sure." + calls('{"magic_int": {"ref": 1, "name": "a}\\"b"}}', TIME), "", "Sure.",
     [("magic_int", {"ref": 1, "name": 'a}"b'}), ("get_time", {"city": "Paris"})]),
    ("blanks inside", BOTH, '<|tools_prefix|>[ { "get_time" : {"city": "P"} } ]<|tools_suffix|>',
     "", "", [("get_time", {"city": "P"})]),
    ("a call cut off", BOTH, '<|tools_prefix|>[{"get_time": {"city": "Pa', "", "", []),
]  # fmt: skip
CASES = cases(APERTUS_T, ROWS)


test_parser_matches_llama_cpp = parser_test(CASES, steps=(1, 5, 100_000))


@pytest.mark.parametrize("text", [
    calls(TIME),
    calls('{"magic_int": {"ref": 1, "name": "x"}}', TIME),
])  # fmt: skip
def test_required_grammar_accepts_calls(text: str) -> None:
    assert required_accepts(APERTUS, BOTH, text)


@pytest.mark.parametrize("text", [
    calls('{"magic_int": {"ref": "x", "name": "x"}}'),  # not an integer
    calls('{"name": "get_time", "arguments": {"city": "Paris"}}'),  # the name is the key
    calls('{"other": {"city": "x"}}'),  # not offered
    HELLO + calls(TIME),  # text before a forced call
])  # fmt: skip
def test_required_grammar_rejects_malformed_calls(text: str) -> None:
    assert not required_accepts(APERTUS, BOTH, text)


def test_lazy_grammar_and_detection() -> None:
    spec = APERTUS.grammar(BOTH, ToolChoice("auto"), parallel=False)
    assert spec.lazy and "tools_prefix" in spec.trigger_patterns[0]
    assert spec.trigger_words == ("<|tools_prefix|>",)
    assert detected(APERTUS_T) is APERTUS


def test_past_calls_render_as_the_grammar_writes_them() -> None:
    messages = past_calls([("magic_int", '{"ref": 42, "name": "foo bar"}', "ok"),
                           ("get_time", '{"city": "Paris"}', "sunny")])  # fmt: skip
    rendered = calls('{"magic_int": {"ref": 42, "name": "foo bar"}}', TIME)
    text = assert_renders(APERTUS_T, messages, tuple(BOTH), rendered, APERTUS)
    assert rendered + "[ok, sunny]" in text
