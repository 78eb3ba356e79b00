"""Kimi K2's calls, against the cases of llama.cpp's tests/test-chat.cpp (the blocks of
Kimi-K2-Thinking.jinja, moonshotai-Kimi-K2.jinja and Kimi-K2-Instruct.jinja; parser
common/parsers/kimi-k2.cpp): the plan's parser fed whole and one character at a time
(it splits the thinking itself: Kimi calls from inside it), the grammars checked by
llama.cpp's own grammar engine (tests/chat/gbnf_check.py), past calls rendered."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chat.formats_sections import KIMI_K2
from chat.plan import ChatOptions, plan_chat
from chat.tools import Tool, ToolChoice
from tests.chat import llama_tools as T
from tests.chat.gbnf_check import accepts
from tests.chat.llama_cases import (
    HELLO,
    SPECIAL,
    USER,
    ParseCase,
    Row,
    assert_renders,
    detected,
    parser_test,
    past_calls,
    required_accepts,
    template,
)
from tests.chat.parse_run import run

THINKING = "Kimi-K2-Thinking.jinja"
EOS = "<|im_end|>"
OPEN, CLOSE = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
EXECUTE = Tool(
    "execute_command",
    "Execute shell command",
    {
        "type": "object",
        "properties": {
            "command": {"type": "string"},
            "cwd": {"type": "string"},
            "timeout": {"type": "integer"},
        },
        "required": ["command"],
    },
)
EMPTY_ARGS = Tool("empty_args", "", {"type": "object", "properties": {}})


def call(name: str, index: int, args: str, end: bool = True) -> str:
    tail = "<|tool_call_end|>" if end else ""
    return f"<|tool_call_begin|>functions.{name}:{index}<|tool_call_argument_begin|>{args}{tail}"


TWO = [T.special_function_tool, T.python_tool]
PYTHON = '{"code": "print(\'hey\')"}'
# (the test-chat.cpp case, template, tools, output, reasoning, content, calls)
ROWS: list[Row] = [
    ("basic content only", THINKING, [], HELLO, "", HELLO, []),
    ("single tool call", THINKING, [T.special_function_tool],
     OPEN + call("special_function", 0, '{"arg1": 1}') + CLOSE, "", "", SPECIAL),
    ("single tool call with reasoning", THINKING, [T.special_function_tool],
     "<think>I'm thinking about this</think>" + OPEN + call("special_function", 0, '{"arg1": 1}')
     + CLOSE, "I'm thinking about this", "", SPECIAL),
    ("tool call with content", THINKING, [T.special_function_tool],
     HELLO + OPEN + call("special_function", 0, '{"arg1": 1}') + CLOSE, "", HELLO, SPECIAL),
    ("multiple tool calls (parallel)", THINKING,
     [T.special_function_tool, T.special_function_tool_with_optional_param],
     OPEN + call("special_function", 0, '{"arg1": 1}')
     + call("special_function_with_opt", 1, '{"arg1": 1, "arg2": 2}') + CLOSE, "", "",
     SPECIAL + [("special_function_with_opt", {"arg1": 1, "arg2": 2})]),
    ("multiple tool calls with reasoning", THINKING, TWO,
     "<think>I need to call two functions</think>" + OPEN + call("special_function", 0, '{"arg1": 1}')
     + call("python", 1, PYTHON) + CLOSE, "I need to call two functions", "",
     SPECIAL + [("python", {"code": "print('hey')"})]),
    ("python tool with multiline code", THINKING, [T.python_tool],
     OPEN + call("python", 0, '{"code": "def hello():\\n    print(\\"Hello, world!\\")\\n\\nhello()"}')
     + CLOSE, "", "", [("python", {"code": 'def hello():\n    print("Hello, world!")\n\nhello()'})]),
    ("tool call with empty arguments", THINKING, [EMPTY_ARGS],
     OPEN + call("empty_args", 0, "{}") + CLOSE, "", "", [("empty_args", {})]),
    ("three tool calls", THINKING, [T.special_function_tool, T.python_tool, T.html_tool],
     OPEN + call("special_function", 0, '{"arg1": 1}') + call("python", 1, '{"code": "print(1)"}')
     + call("html", 2, '{"markup": "<p>test</p>"}') + CLOSE, "", "",
     SPECIAL + [("python", {"code": "print(1)"}), ("html", {"markup": "<p>test</p>"})]),
    ("calls inside the thinking block", THINKING, TWO,
     "<think>I need to call two functions" + OPEN + call("special_function", 0, '{"arg1": 1}')
     + call("python", 1, PYTHON) + CLOSE, "I need to call two functions", "",
     SPECIAL + [("python", {"code": "print('hey')"})]),
    ("inside thinking, without section or end markers", THINKING, TWO,
     "<think>I need to call two functions" + call("special_function", 0, '{"arg1": 1}', end=False)
     + call("python", 1, PYTHON, end=False), "I need to call two functions", "",
     SPECIAL + [("python", {"code": "print('hey')"})]),
    ("real life: execute_command", THINKING, [EXECUTE],
     call("execute_command", 0, '{"command": "ls -lah", "cwd": "/home/user/development/exllamav3",'
          ' "timeout": 10}', end=False), "", "",
     [("execute_command", {"command": "ls -lah", "cwd": "/home/user/development/exllamav3",
                           "timeout": 10})]),
    ("old template: content", "moonshotai-Kimi-K2.jinja", [], HELLO, "", HELLO, []),
    ("old template: a call", "moonshotai-Kimi-K2.jinja", [T.special_function_tool],
     OPEN + call("special_function", 0, '{"arg1": 1}') + CLOSE, "", "", SPECIAL),
    ("Kimi-K2-Instruct: content", "Kimi-K2-Instruct.jinja", [], HELLO, "", HELLO, []),
    ("Kimi-K2-Instruct: a call", "Kimi-K2-Instruct.jinja", [T.special_function_tool],
     OPEN + call("special_function", 0, '{"arg1": 1}') + CLOSE, "", "", SPECIAL),
]  # fmt: skip
CASES = [ParseCase(*c, eos=EOS) for c in ROWS]


test_parser_matches_llama_cpp = parser_test(CASES, steps=(1, 6, 100_000))


def test_partial_call_is_held_and_then_dropped() -> None:
    # "partial tool call (streaming)": llama.cpp shows the partial arguments; kvserve
    # holds a call until it is complete, and a call cut off (max_tokens) is not reported
    plan = plan_chat(template(THINKING, EOS), USER, ChatOptions(tools=(T.special_function_tool,)))
    got = run(plan.parser(), OPEN + call("special_function", 0, '{"arg1": ', end=False), 1)
    assert got == {"content": "", "reasoning_content": "", "tool_calls": []}


def test_reasoning_format_none_keeps_the_thinking_in_the_content() -> None:
    opts = ChatOptions(reasoning_format="none")
    plan = plan_chat(template(THINKING, EOS), USER, opts)
    got = run(plan.parser(), "<think>hm</think>Hi", 1)
    assert got["content"] == "<think>hm</think>Hi" and got["reasoning_content"] == ""


@pytest.mark.parametrize(
    "text",
    [
        OPEN + call("special_function", 0, '{"arg1": 1}') + CLOSE,
        call("special_function", 3, '{"arg1": 1}'),  # no section tokens
        "<think>first</think>" + OPEN + call("special_function", 0, '{"arg1": 1}') + CLOSE,
        OPEN + call("special_function", 0, '{"arg1": 1}') + call("python", 1, PYTHON) + CLOSE,
    ],
)
def test_required_grammar_accepts_calls(text: str) -> None:
    assert required_accepts(KIMI_K2, TWO, text)


@pytest.mark.parametrize(
    "text",
    [
        OPEN + call("special_function", 0, '{"arg1": "x"}') + CLOSE,  # an integer given text
        OPEN + call("get_time", 0, '{"city": "x"}') + CLOSE,  # not offered
        OPEN + call("special_function", 0, '{"arg1": 1}').replace(":0", "") + CLOSE,  # no index
        "Sure. " + OPEN + call("special_function", 0, '{"arg1": 1}') + CLOSE,
    ],
)
def test_required_grammar_rejects_malformed_calls(text: str) -> None:
    assert not required_accepts(KIMI_K2, TWO, text)


def test_lazy_grammar_starts_at_a_call_as_llama_cpp_triggers_it() -> None:
    spec = KIMI_K2.grammar(TWO, ToolChoice("auto"), parallel=False)
    assert spec.lazy and spec.trigger_words == ("<|tool_call_begin|>",)
    one = call("special_function", 0, '{"arg1": 1}')
    assert accepts(spec.gbnf, one + CLOSE) and accepts(spec.gbnf, one)
    assert not accepts(spec.gbnf, one + call("python", 1, PYTHON))  # parallel off


@pytest.mark.parametrize("name", [THINKING, "moonshotai-Kimi-K2.jinja", "Kimi-K2-Instruct.jinja"])
def test_detection_from_llama_cpp_templates(name: str) -> None:
    assert detected(name) is KIMI_K2


@pytest.mark.parametrize("name", [THINKING, "Kimi-K2-Instruct.jinja"])
def test_past_calls_render_with_the_templates_ids_and_the_grammar_accepts_them(name: str) -> None:
    messages = past_calls([("special_function", '{"arg1": 1}', "ok"),
                           ("python", json.dumps({"code": "print('hey')"}), "hey")],
                          ids=("call_a", "call_b"))  # fmt: skip
    rendered = OPEN + call("special_function", 0, '{"arg1": 1}') + call("python", 1, PYTHON) + CLOSE
    # the template numbers the calls itself
    text = assert_renders(name, messages, tuple(TWO), rendered, KIMI_K2, EOS)
    assert "## Return of functions.python:1" in text


def test_the_grammar_forces_the_conversations_next_call_index() -> None:
    # the template numbers every call of the conversation (0, 1, ...): the next one is
    # the count of calls the prompt holds; a parallel call after it may take any index
    def plan(messages: list[dict[str, Any]]) -> str:
        opts = ChatOptions(tools=(T.special_function_tool, T.python_tool),
                           tool_choice=ToolChoice("required"))  # fmt: skip
        grammar = plan_chat(template("Kimi-K2-Instruct.jinja"), messages, opts).grammar
        assert grammar is not None
        return grammar.gbnf

    first = plan(USER)
    assert accepts(first, OPEN + call("python", 0, PYTHON) + CLOSE)
    assert not accepts(first, OPEN + call("python", 1234, PYTHON) + CLOSE)
    assert accepts(first, OPEN + call("python", 0, PYTHON) + call("python", 7, PYTHON) + CLOSE)
    history = past_calls([("special_function", '{"arg1": 1}', "ok"), ("python", PYTHON, "hey")],
                         ids=("call_a", "call_b"))  # fmt: skip
    third = plan([*history, {"role": "user", "content": "again"}])
    assert accepts(third, OPEN + call("python", 2, PYTHON) + CLOSE)
    assert not accepts(third, OPEN + call("python", 0, PYTHON) + CLOSE)
