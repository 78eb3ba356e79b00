"""DeepSeek V3.1 and R1 calls, against the cases of llama.cpp's tests/test-chat.cpp (the
blocks of deepseek-ai-DeepSeek-V3.1.jinja, llama-cpp-deepseek-r1.jinja and the two
R1 distills): the whole plan's parser (thinking split included) fed whole and one
character at a time, the grammars checked by llama.cpp's own grammar engine
(tests/chat/gbnf_check.py), past calls rendered through the templates."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chat.formats import GENERIC
from chat.formats_sections import DEEPSEEK_R1, DEEPSEEK_V3
from chat.plan import ChatOptions, plan_chat
from chat.tools import ToolChoice
from tests.chat import llama_tools as T
from tests.chat.gbnf_check import accepts
from tests.chat.llama_cases import (
    HELLO,
    USER,
    ParseCase,
    SwitchedRow,
    assert_renders,
    detected,
    parser_test,
    past_calls,
    required_accepts,
    template,
)
from tests.chat.parse_run import run

V31 = "deepseek-ai-DeepSeek-V3.1.jinja"
R1 = "llama-cpp-deepseek-r1.jinja"
R1_QWEN = "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"
R1_LLAMA = "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja"
BEGIN, END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"


def v31(name: str, args: str) -> str:
    return f"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{args}<｜tool▁call▁end｜>"


def r1(name: str, args: str) -> str:
    return (
        f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}```<｜tool▁call▁end｜>"
    )


# (the test-chat.cpp case, template, thinking, tools, output, reasoning, content, calls)
ROWS: list[SwitchedRow] = [
    ("V3.1: a call, thinking off", V31, False, [T.get_time_tool],
     BEGIN + v31("get_time", '{"city": "XYZCITY"}') + END, "", "",
     [("get_time", {"city": "XYZCITY"})]),
    ("V3.1: reasoning then a call", V31, True, [T.get_time_tool],
     "REASONING</think>" + BEGIN + v31("get_time", '{"city": "Tokyo"}') + END, "REASONING", "",
     [("get_time", {"city": "Tokyo"})]),
    ("V3.1: reasoning, content, parallel calls", V31, True, [T.get_time_tool, T.get_weather_tool],
     "REASONING</think>CONTENT" + BEGIN + v31("get_time", '{"city": "Paris"}')
     + v31("get_weather", '{"city": "Paris"}') + END, "REASONING", "CONTENT",
     [("get_time", {"city": "Paris"}), ("get_weather", {"city": "Paris"})]),
    ("V3.1: reasoning then content", V31, True, [], "REASONING</think>\nCONTENT", "REASONING",
     "CONTENT", []),
    ("V3.1: content, thinking off", V31, False, [], "CONTENT", "", "CONTENT", []),
    ("R1 (llama.cpp's): empty thinking", R1, True, [], "</think>" + HELLO, "", HELLO, []),
    ("R1 (llama.cpp's): thoughts", R1, True, [], "I'm\nthinking</think>" + HELLO, "I'm\nthinking",
     HELLO, []),
    ("R1 (llama.cpp's): a call", R1, True, [T.special_function_tool],
     "</think>" + BEGIN + r1("special_function", '{"arg1": 1}') + END, "", "",
     [("special_function", {"arg1": 1})]),
    ("R1 Distill Qwen: empty thinking", R1_QWEN, True, [], "</think>" + HELLO, "", HELLO, []),
    ("R1 Distill Qwen: thoughts", R1_QWEN, True, [], "I'm\nthinking</think>" + HELLO,
     "I'm\nthinking", HELLO, []),
    ("R1 Distill Qwen: a call, thinking off", R1_QWEN, False, [T.special_function_tool],
     BEGIN + r1("special_function", '{"arg1": 1}') + END, "", "",
     [("special_function", {"arg1": 1})]),
    ("R1 Distill Llama: empty thinking", R1_LLAMA, True, [], "</think>" + HELLO, "", HELLO, []),
    ("R1 Distill Llama: thoughts", R1_LLAMA, True, [], "I'm\nthinking</think>" + HELLO,
     "I'm\nthinking", HELLO, []),
]  # fmt: skip
CASES = [ParseCase.switched(("thinking", "enable_thinking"), *c) for c in ROWS]


test_parser_matches_llama_cpp = parser_test(CASES, steps=(1, 4, 100_000))


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        (DEEPSEEK_V3, BEGIN + v31("get_time", '{"city": "Paris"}') + END),
        (DEEPSEEK_V3, "I think.</think>" + BEGIN + v31("get_time", '{"city": "Paris"}') + END),
        (
            DEEPSEEK_V3,
            BEGIN
            + v31("get_time", '{"city": "Paris"}')
            + v31("get_weather", '{"city": "Rome"}')
            + END,
        ),  # fmt: skip
        (DEEPSEEK_R1, BEGIN + r1("get_time", '{"city": "Paris"}').replace("}```", "}\n```") + END),
        (
            DEEPSEEK_R1,
            BEGIN
            + r1("get_time", '{"city": "Paris"}').replace("}```", "}\n```")
            + "\n"
            + r1("get_weather", '{"city": "Rome"}').replace("}```", "}\n```")
            + END,
        ),  # fmt: skip
    ],
)
def test_required_grammar_accepts_calls(fmt: Any, text: str) -> None:
    assert required_accepts(fmt, [T.get_time_tool, T.get_weather_tool], text)


@pytest.mark.parametrize(
    "text",
    [
        BEGIN + v31("get_time", '{"city": 1}') + END,  # a string parameter given a number
        BEGIN + v31("get_date", '{"city": "Paris"}') + END,  # not offered
        BEGIN + v31("get_time", '{"city": "Paris"}'),  # the section never ends
        v31("get_time", '{"city": "Paris"}'),  # no section
        "Sure." + BEGIN + v31("get_time", '{"city": "Paris"}') + END,  # text, no </think>
        "a</think>b</think>" + BEGIN + v31("get_time", '{"city": "Paris"}') + END,
    ],
)
def test_required_grammar_rejects_malformed_calls(text: str) -> None:
    assert not required_accepts(DEEPSEEK_V3, [T.get_time_tool], text)


def test_parallel_false_allows_one_call() -> None:
    spec = DEEPSEEK_V3.grammar([T.get_time_tool], ToolChoice("required"), parallel=False)
    one = v31("get_time", '{"city": "Paris"}')
    assert accepts(spec.gbnf, BEGIN + one + END)
    assert not accepts(spec.gbnf, BEGIN + one + one + END)


def test_lazy_grammar_in_auto_mode_starts_at_the_section() -> None:
    spec = DEEPSEEK_V3.grammar([T.get_time_tool], ToolChoice("auto"), parallel=True)
    assert spec.lazy
    assert spec.trigger_words == (BEGIN,)
    assert spec.trigger_patterns == (r"[\s\S]*?(<｜tool▁calls▁begin｜>)[\s\S]*",)
    assert accepts(spec.gbnf, BEGIN + v31("get_time", '{"city": "Paris"}') + END)
    assert not accepts(spec.gbnf, "x</think>" + BEGIN + v31("get_time", '{"city": "P"}') + END)


def test_auto_with_a_response_schema_is_calls_or_the_document() -> None:
    doc = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    spec = DEEPSEEK_V3.grammar([T.get_time_tool], ToolChoice("auto"), True, doc)
    assert not spec.lazy
    assert accepts(spec.gbnf, 'ok</think>{"answer": "hi"}')
    assert accepts(spec.gbnf, BEGIN + v31("get_time", '{"city": "Paris"}') + END)
    assert not accepts(spec.gbnf, '{"other": 1}')


def test_truncated_call_is_not_reported() -> None:
    plan = plan_chat(template(V31), USER, ChatOptions(tools=(T.get_time_tool,)))
    got = run(plan.parser(), "Hi " + BEGIN + v31("get_time", '{"city": "Par'), 1)
    assert got == {"content": "Hi ", "reasoning_content": "", "tool_calls": []}


@pytest.mark.parametrize(
    ("name", "fmt"),
    [(V31, DEEPSEEK_V3), (R1, DEEPSEEK_R1), (R1_QWEN, DEEPSEEK_R1), (R1_LLAMA, GENERIC)],
)
def test_detection_from_llama_cpp_templates(name: str, fmt: object) -> None:
    assert detected(name) is fmt


R1_RENDERED = (
    BEGIN
    + r1("get_weather", '{"city": "Paris"}\n')
    + "\n"
    + r1("get_time", '{"city": "Paris"}\n')
    + END
)
HISTORY = past_calls([("get_weather", json.dumps({"city": "Paris"}), "sunny"),
                      ("get_time", '{"city": "Paris"}', "noon")],
                     user="Weather and time in Paris?")  # fmt: skip


@pytest.mark.parametrize(
    ("name", "rendered"),
    [
        (
            V31,
            BEGIN
            + v31("get_weather", '{"city": "Paris"}')
            + v31("get_time", '{"city": "Paris"}')
            + END,
        ),  # fmt: skip
        (R1, R1_RENDERED),
        (R1_QWEN, R1_RENDERED),  # the same syntax
    ],
)
def test_past_calls_render_in_the_templates_syntax_and_the_grammar_accepts_them(
    name: str, rendered: str
) -> None:
    # the arguments reach the template as a mapping (`arguments | tojson`, not a quoted
    # string), and the calls as rendered are what the grammar lets the model write, so
    # a sampled call sent back renders to the same text
    assert_renders(name, HISTORY, (T.get_weather_tool, T.get_time_tool), rendered, detected(name))


def test_thinking_switch_opens_the_reasoning_in_the_prompt() -> None:
    on = plan_chat(template(V31), USER, ChatOptions(template_kwargs={"thinking": True}))
    off = plan_chat(template(V31), USER, ChatOptions(template_kwargs={"thinking": False}))
    assert on.prompt.text.endswith("<｜Assistant｜><think>") and on.reasoning_inside
    assert off.prompt.text.endswith("<think></think>") and not off.reasoning_inside
    # `enable_thinking` (what reasoning_effort sets) reaches the template's `thinking`
    effort = plan_chat(template(V31), USER, ChatOptions(template_kwargs={"enable_thinking": True}))
    assert effort.reasoning_inside


def test_a_prompt_that_closed_the_thinking_admits_only_a_literal_think_block() -> None:
    # V3.1 with thinking off ends its prompt `<think></think>`: text up to `</think>`
    # would let a model write prose until max_tokens (seen on SmolLM2); llama.cpp's
    # grammar only takes a block that opens with `<think>`
    call = BEGIN + v31("get_time", '{"city": "Paris"}') + END
    off = plan_chat(template(V31), USER, ChatOptions(tools=(T.get_time_tool,),
                                                     tool_choice=ToolChoice("required")))  # fmt: skip
    assert off.prompt.text.endswith("<think></think>") and off.grammar is not None
    assert accepts(off.grammar.gbnf, call)
    assert accepts(off.grammar.gbnf, "<think>x</think>" + call)
    assert not accepts(off.grammar.gbnf, "The weather is</think>" + call)
    on = plan_chat(template(V31), USER, ChatOptions(tools=(T.get_time_tool,),
                                                    tool_choice=ToolChoice("required"),
                                                    template_kwargs={"thinking": True}))  # fmt: skip
    assert on.prompt.text.endswith("<think>") and on.grammar is not None
    assert accepts(on.grammar.gbnf, "The weather is</think>" + call)  # inside it: text
