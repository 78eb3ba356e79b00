"""Command R7B's blocks, against the cases of llama.cpp's tests/test-chat.cpp (the
CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja blocks): the plan's parser fed
whole and one character at a time, the grammars checked by llama.cpp's own grammar
engine (tests/chat/gbnf_check.py), past calls rendered through the template."""

from __future__ import annotations

from typing import Any

import pytest

from chat.formats_cohere import COMMAND_R7B
from chat.plan import ChatOptions, plan_chat
from chat.tools import Tool, ToolChoice
from tests.chat import llama_tools as T
from tests.chat.gbnf_check import accepts
from tests.chat.llama_cases import (
    HELLO,
    SPECIAL,
    ParseCase,
    detected,
    parser_test,
    past_calls,
    required_accepts,
    template,
)

R7B = "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja"
THOUGHTS = "<|START_THINKING|>I'm\nthinking<|END_THINKING|>"
ACTION = (
    "<|START_ACTION|>[\n"
    '    {"tool_call_id": "0", "tool_name": "special_function", "parameters": {"arg1": 1}}\n'
    "]<|END_ACTION|>"
)


def case(
    name: str, reasoning_format: str, tools: list[Tool], text: str, reasoning: str, content: str,
    calls: list[tuple[str, Any]],
) -> ParseCase:  # fmt: skip
    return ParseCase(name, R7B, tools, text, reasoning, content, calls,
                     {"reasoning_format": reasoning_format})  # fmt: skip


# (the test-chat.cpp case, reasoning_format, tools, output, reasoning, content, calls)
CASES = [case(*c) for c in [
    ("response block", "auto", [], f"<|START_RESPONSE|>{HELLO}<|END_RESPONSE|>", "", HELLO, []),
    ("thinking and response", "auto", [], THOUGHTS + f"<|START_RESPONSE|>{HELLO}<|END_RESPONSE|>",
     "I'm\nthinking", HELLO, []),
    ("thinking unparsed (reasoning_format none)", "none", [],
     THOUGHTS + f"<|START_RESPONSE|>{HELLO}<|END_RESPONSE|>", "", THOUGHTS + HELLO, []),
    ("thinking and a call", "auto", [T.special_function_tool], THOUGHTS + ACTION, "I'm\nthinking",
     "", SPECIAL),
    ("partial call (cut off: not reported)", "auto", [T.special_function_tool],
     THOUGHTS + '<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "special_function", ',
     "I'm\nthinking", "", []),
    ("empty thinking and a call", "auto", [T.special_function_tool],
     "<|START_THINKING|><|END_THINKING|>" + ACTION, "", "", SPECIAL),
]]  # fmt: skip


test_parser_matches_llama_cpp = parser_test(CASES, steps=(1, 7, 100_000))


TWO = [T.special_function_tool, T.python_tool]
PYTHON = '{"tool_call_id": "1", "tool_name": "python", "parameters": {"code": "print(1)"}}'


@pytest.mark.parametrize(
    "text",
    [
        ACTION,
        THOUGHTS + ACTION,
        "plan only<|END_THINKING|>" + ACTION,
        ACTION.replace("}\n]", "},\n\n    \n    " + PYTHON + "\n\n    \n]"),
    ],
)
def test_required_grammar_accepts_calls(text: str) -> None:
    assert required_accepts(COMMAND_R7B, TWO, text)


@pytest.mark.parametrize(
    "text",
    [
        ACTION.replace('"arg1": 1', '"arg1": "x"'),  # an integer given text
        ACTION.replace("special_function", "other"),  # not offered
        ACTION.replace('"tool_name"', '"name"'),
        f"<|START_RESPONSE|>{HELLO}<|END_RESPONSE|>",  # no call
    ],
)
def test_required_grammar_rejects_malformed_calls(text: str) -> None:
    assert not required_accepts(COMMAND_R7B, TWO, text)


def test_lazy_grammar_and_parallel_off() -> None:
    spec = COMMAND_R7B.grammar(TWO, ToolChoice("auto"), parallel=False)
    assert spec.lazy and spec.trigger_words == ("<|START_ACTION|>",)
    assert accepts(spec.gbnf, ACTION)
    assert not accepts(spec.gbnf, ACTION.replace("}\n]", "}, " + PYTHON + "\n]"))


def test_detection() -> None:
    assert detected(R7B) is COMMAND_R7B
    assert detected("Cohere2MoE.jinja").name == "cohere2-moe"


def test_past_calls_render_as_the_grammar_writes_them() -> None:
    messages = past_calls([("special_function", '{"arg1": 1}', "ok"),
                           ("python", '{"code": "print(1)"}', "1")])  # fmt: skip
    text = plan_chat(template(R7B), messages, ChatOptions(tools=tuple(TWO))).prompt.text
    start = text.index("<|START_ACTION|>[")
    action = text[start : text.index("]<|END_ACTION|>", start) + len("]<|END_ACTION|>")]
    assert '"tool_name": "python", "parameters": {"code": "print(1)"}' in action
    assert accepts(COMMAND_R7B.grammar(TWO, ToolChoice("required"), True).gbnf, action)
