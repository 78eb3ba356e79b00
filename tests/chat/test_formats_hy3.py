"""Tencent Hy3's `<tool_calls:opensource>` calls and `<think:opensource>` thinking, the
syntax llama.cpp's autoparser derives from the template's renders. test-chat.cpp has no
parser case for it (it checks only that the template takes a reasoning effort), so the
cases here are kvserve's own, written from the template's renders: the plan's parser fed
whole and in pieces, the grammars checked by llama.cpp's own grammar engine, past calls
rendered through the template as the grammar writes them."""

from __future__ import annotations

from typing import Any

import pytest

from chat.formats_hy3 import HY3
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
    required_accepts,
    template,
)

HY = "tencent-Hy3.jinja"
THINK, END = "<think:opensource>", "</think:opensource>"
HIGH_KWARGS: dict[str, Any] = {"reasoning_effort": "high"}


def call(name: str, *args: tuple[str, str]) -> str:
    body = "".join(
        f"<arg_key:opensource>{k}</arg_key:opensource>\n<arg_value:opensource>{v}"
        "</arg_value:opensource>\n"
        for k, v in args
    )
    return f"<tool_call:opensource>{name}<tool_sep:opensource>\n{body}</tool_call:opensource>\n"


def block(*calls: str) -> str:
    return "<tool_calls:opensource>\n" + "".join(calls) + "</tool_calls:opensource>"


BOTH = [T.get_time_tool, T.magic_int_tool]
# (name, tools, output, reasoning, content, calls)
ROWS: list[tuple[Any, ...]] = [
    ("content", [], HELLO, "", HELLO, []),
    ("a call", [T.special_function_tool], block(call("special_function", ("arg1", "1"))), "", "",
     SPECIAL),
    ("text and two calls, typed", BOTH,
     "Sure." + block(call("magic_int", ("ref", "-3"), ("name", "12")),
                     call("get_time", ("city", "Paris"))),
     "", "Sure.", [("magic_int", {"ref": -3, "name": "12"}), ("get_time", {"city": "Paris"})]),
    ("a call cut off", BOTH, "<tool_calls:opensource>\n<tool_call:opensource>get_time"
     "<tool_sep:opensource>\n<arg_key:opensource>city</arg_key:opensource>\n<arg_v", "", "", []),
]  # fmt: skip
# reasoning_effort high: the prompt opens the thinking
HIGH_ROWS: list[tuple[Any, ...]] = [
    ("thinking then content", [], f"I'm\nthinking{END}{HELLO}", "I'm\nthinking", HELLO, []),
    ("thinking then a call", BOTH, f"which city?{END}" + block(call("get_time", ("city", "a b"))),
     "which city?", "", [("get_time", {"city": "a b"})]),
]  # fmt: skip
CASES = cases(HY, ROWS) + cases(HY, HIGH_ROWS, template_kwargs=HIGH_KWARGS)


test_parser = parser_test(CASES, steps=(1, 4, 100_000))


@pytest.mark.parametrize("text", [
    block(call("get_time", ("city", "Paris"))),
    f"{THINK}hm{END}" + block(call("get_time", ("city", "Paris"))),
    block(call("magic_int", ("ref", "1"), ("name", "x")), call("get_time", ("city", "a\nb"))),
])  # fmt: skip
def test_required_grammar_accepts_calls(text: str) -> None:
    assert required_accepts(HY3, BOTH, text)


@pytest.mark.parametrize("text", [
    block(call("magic_int", ("ref", "x"), ("name", "x"))),  # not an integer
    block(call("magic_int", ("name", "x"))),  # the required one left out
    block(call("other", ("city", "x"))),  # not offered
    HELLO + block(call("get_time", ("city", "Paris"))),  # text before a forced call
])  # fmt: skip
def test_required_grammar_rejects_malformed_calls(text: str) -> None:
    assert not required_accepts(HY3, BOTH, text)


def test_lazy_grammar_detection_and_thinking_tags() -> None:
    spec = HY3.grammar(BOTH, ToolChoice("auto"), parallel=False)
    assert spec.lazy and "tool_calls:opensource" in spec.trigger_patterns[0]
    assert detected(HY) is HY3
    plan = plan_chat(template(HY), USER, ChatOptions(template_kwargs=HIGH_KWARGS))
    assert plan.prompt.text.endswith(THINK) and plan.reasoning_inside
    assert plan.thinking.close == END


def test_a_prompt_that_opens_thinking_must_close_it_before_a_forced_call() -> None:
    forced = ChatOptions(
        tools=tuple(BOTH), tool_choice=ToolChoice("required"), template_kwargs=HIGH_KWARGS
    )
    grammar = plan_chat(template(HY), USER, forced).grammar
    assert grammar is not None
    assert accepts(grammar.gbnf, "hm" + END + block(call("get_time", ("city", "P"))))
    assert not accepts(grammar.gbnf, block(call("get_time", ("city", "P"))))
    default = ChatOptions(tools=tuple(BOTH), tool_choice=ToolChoice("required"))
    plan = plan_chat(template(HY), USER, default)  # no_think: the prompt closes it empty
    assert plan.prompt.text.endswith(THINK + END) and plan.grammar is not None
    assert accepts(plan.grammar.gbnf, block(call("get_time", ("city", "P"))))


def test_past_calls_render_as_the_grammar_writes_them() -> None:
    messages = past_calls([("magic_int", '{"ref": 42, "name": "foo bar"}', "ok"),
                           ("get_time", '{"city": "Paris"}', "sunny")])  # fmt: skip
    rendered = block(call("magic_int", ("ref", "42"), ("name", "foo bar")),
                     call("get_time", ("city", "Paris")))  # fmt: skip
    text = assert_renders(HY, messages, tuple(BOTH), rendered, HY3)
    assert "<tool_response:opensource>\nok\n</tool_response:opensource>" in text
