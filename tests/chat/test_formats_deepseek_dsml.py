"""DeepSeek V3.2 and V4's DSML calls, against the cases of llama.cpp's tests/test-chat.cpp
(its blocks for deepseek-ai-DeepSeek-V3.2.jinja, -V4.jinja and -V4-Flash-0731.jinja;
the continuation cases are left out: kvserve continues no final message into a call):
the whole plan's parser (thinking split included) fed whole and one character at a time,
the grammars checked by llama.cpp's own grammar engine (tests/chat/gbnf_check.py), past
calls rendered through the templates."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chat.formats_deepseek_dsml import DEEPSEEK_V4, DEEPSEEK_V32, DsmlFormat, sort_results
from chat.plan import ChatOptions, plan_chat
from chat.tools import Tool, ToolChoice
from tests.chat import llama_tools as T
from tests.chat.gbnf_check import accepts
from tests.chat.llama_cases import (
    HELLO,
    SPECIAL,
    USER,
    ParseCase,
    SwitchedRow,
    assert_renders,
    detected,
    parser_test,
    past_calls,
    template,
    truncated,
)
from tests.chat.parse_run import run

V32 = "deepseek-ai-DeepSeek-V3.2.jinja"
V4 = "deepseek-ai-DeepSeek-V4.jinja"
V4_FLASH = "deepseek-ai-DeepSeek-V4-Flash-0731.jinja"
DSML = "｜DSML｜"


def block(fmt: DsmlFormat, *invokes: str) -> str:
    return f"<{DSML}{fmt.block}>\n" + "".join(invokes) + f"</{DSML}{fmt.block}>"


def invoke(name: str, *params: tuple[str, bool, str]) -> str:
    body = "".join(f'<{DSML}parameter name="{key}" string="{"true" if string else "false"}">'
                   f"{value}</{DSML}parameter>\n" for key, string, value in params)  # fmt: skip
    return f'<{DSML}invoke name="{name}">\n{body}</{DSML}invoke>\n'


TOKYO = invoke("get_time", ("city", True, "Tokyo"))
ARG1 = invoke("special_function", ("arg1", False, "1"))
BOTH = (invoke("get_time", ("city", True, "Paris")), invoke("get_weather", ("city", True, "Paris")))
PARIS2 = [("get_time", {"city": "Paris"}), ("get_weather", {"city": "Paris"})]
THOUGHTS = "I'm\nthinking</think>" + HELLO


def rows(name: str, fmt: DsmlFormat) -> list[SwitchedRow]:
    """test-chat.cpp's cases for V3.2 (V4 repeats most of them with its block's name)."""
    return [
        (f"{name}: pure content", name, False, [], HELLO, "", HELLO, []),
        (f"{name}: thinking + content", name, True, [], THOUGHTS, "I'm\nthinking", HELLO, []),
        (f"{name}: thinking + a call", name, True, [T.get_time_tool],
         "Let me check the time</think>\n\n" + block(fmt, TOKYO), "Let me check the time", "",
         [("get_time", {"city": "Tokyo"})]),
        (f"{name}: a call, thinking off", name, False, [T.special_function_tool],
         block(fmt, ARG1), "", "", SPECIAL),
        (f"{name}: parallel calls with reasoning", name, True,
         [T.get_time_tool, T.get_weather_tool], "Calling both</think>\n\n" + block(fmt, *BOTH),
         "Calling both", "", PARIS2),
        (f"{name}: content before the calls", name, True, [T.special_function_tool],
         "Thinking about it</think>Let me call the function.\n\n" + block(fmt, ARG1),
         "Thinking about it", "Let me call the function.", SPECIAL),
        (f"{name}: multiple params, mixed types", name, True, [T.magic_int_tool],
         "Multi-arg call</think>\n\n" + block(fmt, invoke(
             "magic_int", ("ref", False, "42"), ("name", True, "foo bar"))),
         "Multi-arg call", "", [("magic_int", {"ref": 42, "name": "foo bar"})]),
    ]  # fmt: skip


def typed(tool: Any, key: str, text: str, value: Any) -> SwitchedRow:
    """V3.2's cases of one `string="false"` value read as JSON."""
    case = block(DEEPSEEK_V32, invoke(tool.name, (key, False, text)))
    name = f"deepseek-ai-DeepSeek-V3.2.jinja: {tool.name} {text}"
    return (name, V32, True, [tool], f"Test</think>\n\n{case}", "Test", "",
            [(tool.name, {key: value})])  # fmt: skip


ROWS: list[SwitchedRow] = [
    *rows(V32, DEEPSEEK_V32),
    typed(T.magic_int_tool, "ref", "-14", -14),
    typed(T.amount_tool, "orig", "3.14", 3.14),
    typed(T.toggle_tool, "enabled", "true", True),
    typed(T.todo_list, "todos", '["buy milk","walk dog"]', ["buy milk", "walk dog"]),
    typed(T.config_tool, "config", '{"theme":"dark","level":2}', {"theme": "dark", "level": 2}),
    (f"{V32}: empty reasoning", V32, True, [T.get_time_tool],
     "</think>\n\n" + block(DEEPSEEK_V32, invoke("get_time", ("city", True, "XYZCITY"))), "", "",
     [("get_time", {"city": "XYZCITY"})]),
    *rows(V4, DEEPSEEK_V4),
    # the thinking ends at the block's opening too (the grammar constrains it from there)
    (f"{V4}: a call from inside the thinking", V4, True, [T.get_time_tool],
     "Let me check the time\n\n" + block(DEEPSEEK_V4, TOKYO), "Let me check the time", "",
     [("get_time", {"city": "Tokyo"})]),
    # the separator belongs to the block, not to the content
    (f"{V4_FLASH}: a call", V4_FLASH, False, [T.special_function_tool],
     "\n\n" + block(DEEPSEEK_V4, ARG1), "", "", SPECIAL),
]  # fmt: skip
CASES = [ParseCase.switched(("thinking", "enable_thinking"), *c) for c in ROWS]


test_parser_matches_llama_cpp = parser_test(CASES, steps=(1, 4, 100_000))


def test_the_separator_never_reaches_the_content() -> None:
    opts = ChatOptions(tools=(T.special_function_tool,))
    plan = plan_chat(template(V4_FLASH), USER, opts)
    got = run(plan.parser(), "\n\n" + block(DEEPSEEK_V4, ARG1), 1)
    assert got["content"] == "" and got["tool_calls"] == SPECIAL


@pytest.mark.parametrize(
    ("name", "fmt"), [(V32, DEEPSEEK_V32), (V4, DEEPSEEK_V4), (V4_FLASH, DEEPSEEK_V4)]
)
def test_detection_from_llama_cpp_templates(name: str, fmt: DsmlFormat) -> None:
    assert detected(name) is fmt


def forced(name: str, thinking: bool, parallel: bool = True) -> Any:
    opts = ChatOptions(tools=(T.get_time_tool, T.get_weather_tool, T.magic_int_tool),
                       tool_choice=ToolChoice("required"), parallel_tool_calls=parallel,
                       template_kwargs={"thinking": thinking})  # fmt: skip
    plan = plan_chat(template(name), USER, opts)
    assert plan.grammar is not None and not plan.grammar.lazy
    return plan


@pytest.mark.parametrize(("name", "fmt"), [(V32, DEEPSEEK_V32), (V4, DEEPSEEK_V4)])
def test_forced_grammar_takes_calls_after_the_thinking_and_no_free_text(
    name: str, fmt: DsmlFormat
) -> None:
    calls = "\n\n" + block(fmt, *BOTH)
    mixed = block(fmt, invoke("magic_int", ("ref", False, "42"), ("name", True, "foo bar")))
    on, off = forced(name, True), forced(name, False)
    assert on.prompt.text.endswith("<think>")
    assert off.prompt.text.endswith("</think>")  # V3.2 `<think></think>`, V4 a bare close
    assert accepts(on.grammar.gbnf, "Let me see.</think>" + calls)
    assert accepts(on.grammar.gbnf, calls)
    assert accepts(off.grammar.gbnf, calls) and accepts(off.grammar.gbnf, mixed)
    # optional parameters after the required ones, in any order
    reordered = block(fmt, invoke("magic_int", ("name", True, "x"), ("ref", False, "1")))
    assert not accepts(off.grammar.gbnf, reordered)
    for bad in (
        "Sure." + calls,  # free text before a forced call
        "<think>x</think>" + calls,  # thinking is off: no block (llama.cpp negates <think>)
        block(fmt, invoke("get_time", ("city", False, "Paris"))),  # a string as string="false"
        block(fmt, invoke("magic_int", ("ref", True, "42"))),  # an integer as a string
        block(fmt, invoke("get_date", ("city", True, "Paris"))),  # not offered
        block(fmt, TOKYO.replace(">\n<", "><", 1)),  # the line break after the invoke
    ):
        assert not accepts(off.grammar.gbnf, bad), bad
    one = forced(name, False, parallel=False)
    assert accepts(one.grammar.gbnf, block(fmt, BOTH[0]))
    assert not accepts(one.grammar.gbnf, block(fmt, *BOTH))


def test_auto_grammar_is_lazy_at_the_block() -> None:
    spec = DEEPSEEK_V4.grammar([T.get_time_tool], ToolChoice("auto"), parallel=True)
    assert spec.lazy and spec.trigger_words == (f"<{DSML}tool_calls>",)
    assert accepts(spec.gbnf, block(DEEPSEEK_V4, TOKYO))


def test_auto_with_a_response_schema_is_calls_or_the_document() -> None:
    doc = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    spec = DEEPSEEK_V32.grammar([T.get_time_tool], ToolChoice("auto"), True, doc)
    assert not spec.lazy
    assert accepts(spec.gbnf, '{"answer": "hi"}')
    assert accepts(spec.gbnf, block(DEEPSEEK_V32, TOKYO))
    assert not accepts(spec.gbnf, '{"other": 1}')


def test_a_call_cut_off_is_not_reported() -> None:
    assert truncated(V32, [T.get_time_tool], block(DEEPSEEK_V32, TOKYO)[:-40]) == 1


HISTORY = past_calls([("get_weather", json.dumps({"city": "Paris"}), "sunny"),
                      ("magic_int", '{"ref": 42, "name": "x"}', "ok")],
                     user="Weather in Paris, and the magic?")  # fmt: skip


@pytest.mark.parametrize(("name", "fmt"), [(V32, DEEPSEEK_V32), (V4, DEEPSEEK_V4)])
def test_past_calls_render_in_the_templates_syntax_and_the_grammar_accepts_them(
    name: str, fmt: DsmlFormat
) -> None:
    rendered = block(fmt, invoke("get_weather", ("city", True, "Paris")),
                     invoke("magic_int", ("ref", False, "42"), ("name", True, "x")))  # fmt: skip
    text = assert_renders(name, HISTORY, (T.get_weather_tool, T.magic_int_tool),
                          "\n\n" + rendered, fmt)  # fmt: skip
    assert text.index(">sunny</") < text.index(">ok</")


def test_v4_writes_the_results_in_the_order_of_the_calls() -> None:
    swapped = [*HISTORY[:2], HISTORY[3], HISTORY[2]]
    assert sort_results(swapped) == HISTORY
    text = plan_chat(template(V4), swapped, ChatOptions(tools=(T.get_weather_tool,))).prompt.text
    assert text.index(">sunny</") < text.index(">ok</")
    assert DEEPSEEK_V32.adapt_messages("", swapped) == swapped  # V3.2 writes them as they come


def test_a_bounded_string_parameter_keeps_its_length() -> None:
    """A string with maxLength / minLength: that many characters, none of them `<`
    (llama.cpp's grammar takes any text up to the close: a kvserve bound)."""
    schema = {"type": "object", "required": ["city"],
              "properties": {"city": {"type": "string", "minLength": 2, "maxLength": 5}}}  # fmt: skip
    spec = DEEPSEEK_V32.grammar([Tool("get_time", "", schema)], ToolChoice("required"), False)

    def call(city: str) -> str:
        return block(DEEPSEEK_V32, invoke("get_time", ("city", True, city)))

    assert accepts(spec.gbnf, call("Paris")) and accepts(spec.gbnf, call("Oz"))
    assert not accepts(spec.gbnf, call("Parisx")) and not accepts(spec.gbnf, call("P"))
    assert not accepts(spec.gbnf, call("a<b"))
