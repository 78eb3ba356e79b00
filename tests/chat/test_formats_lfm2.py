"""LFM2 / LFM2.5's Python-style call lists, against the cases of llama.cpp's
tests/test-chat.cpp (its shared LFM2 parser cases, run on all three templates, and the
LFM2.5-8B-A1B thinking cases): the plan's parser fed whole and in pieces, the grammars
checked by llama.cpp's own grammar engine, past calls rendered through each template.
Not ported: the partial-call case (kvserve releases a call once its list closes)."""

from __future__ import annotations

from typing import Any

import pytest

from chat.formats_lfm2 import LFM2, LFM25, python_calls
from chat.plan import ChatOptions, plan_chat
from chat.tools import Tool, ToolChoice
from tests.chat import llama_tools as T
from tests.chat.gbnf_check import accepts
from tests.chat.llama_cases import (
    HELLO,
    SPECIAL,
    USER,
    ParseCase,
    assert_renders,
    detected,
    parser_test,
    past_calls,
    replayed,
    required_accepts,
    template,
)

TEMPLATES = ["LFM2-8B-A1B.jinja", "LFM2.5-Instruct.jinja", "LFM2.5-8B-A1B.jinja"]
THINKING = "LFM2.5-8B-A1B.jinja"


def calls(text: str) -> str:
    return f"<|tool_call_start|>[{text}]<|tool_call_end|>"


# (the test-chat.cpp case, tools, output, content, calls): every template
SHARED: list[tuple[str, list[Tool], str, str, list[tuple[str, Any]]]] = [
    ("content", [], HELLO, HELLO, []),
    ("a call", [T.special_function_tool], calls("special_function(arg1=1)"), "", SPECIAL),
    ("a string", [T.get_time_tool], calls('get_time(city="XYZCITY")'), "",
     [("get_time", {"city": "XYZCITY"})]),
    ("True", [T.toggle_tool], calls("toggle(enabled=True)"), "", [("toggle", {"enabled": True})]),
    ("None", [T.nullable_tool], calls("set_nullable(value=None)"), "",
     [("set_nullable", {"value": None})]),
    ("nested Python literal", [T.config_tool],
     calls('set_config(config={"enabled": True, "count": 3})'), "",
     [("set_config", {"config": {"enabled": True, "count": 3}})]),
    ("JSON literals", [T.config_tool], calls('set_config(config={"enabled": true, "note": null})'),
     "", [("set_config", {"config": {"enabled": True, "note": None}})]),
    # kvserve refuses a dotted tool name (OpenAI's rule), so another tool is offered: the
    # parser reads any name, as llama.cpp's
    ("dotted name", [T.get_time_tool],
     calls('Calendar.create_event(title="demo", participants=["Alice", "Bob"], '
           'metadata={"priority": "high", "reminder": true})'), "",
     [("Calendar.create_event", {"title": "demo", "participants": ["Alice", "Bob"],
                                 "metadata": {"priority": "high", "reminder": True}})]),
    ("markdown links stay content", [T.get_time_tool],
     "Use this format: [link text](url). Example: [Wikipedia](https://www.wikipedia.org).",
     "Use this format: [link text](url). Example: [Wikipedia](https://www.wikipedia.org).", []),
    ("multiline code", [T.python_tool], calls('python(code="def hello():\\n    print(\'hey\')")'),
     "", [("python", {"code": "def hello():\n    print('hey')"})]),
    ("escapes", [T.python_tool], calls('python(code="First line\\nSecond line\\tindented")'), "",
     [("python", {"code": "First line\nSecond line\tindented"})]),
    ("escaped quotes", [T.python_tool], calls('python(code="print(\\"hi\\")")'), "",
     [("python", {"code": 'print("hi")'})]),
    ("content before a call", [T.get_time_tool],
     "Let me check the time." + calls('get_time(city="Paris")'), "Let me check the time.",
     [("get_time", {"city": "Paris"})]),
    ("parallel calls", [T.special_function_tool, T.special_function_tool_with_optional_param],
     calls("special_function(arg1=1), special_function_with_opt(arg1=1, arg2=2)"), "",
     [("special_function", {"arg1": 1}), ("special_function_with_opt", {"arg1": 1, "arg2": 2})]),
    ("empty arguments", [T.empty_args_tool], calls("empty_args()"), "", [("empty_args", {})]),
    # kvserve's own: single quotes; a list that is not one stays content; no tools
    ("single quotes", [T.get_time_tool], calls("get_time(city='Paris')"), "",
     [("get_time", {"city": "Paris"})]),
    ("not a call list", [T.get_time_tool], calls("get_time(__import__('os'))"),
     calls("get_time(__import__('os'))"), []),
    ("no tools offered", [], calls("special_function(arg1=1)"), calls("special_function(arg1=1)"),
     []),
]  # fmt: skip
CASES = [ParseCase(f"{name} ({t.removesuffix('.jinja')})", t, tools, text, "", content, found)
         for t in TEMPLATES for name, tools, text, content, found in SHARED]  # fmt: skip
CASES += [ParseCase(name, THINKING, tools, text, reasoning, content, found) for (
    name, tools, text, reasoning, content, found) in [
    ("reasoning and a call", [T.special_function_tool],
     "<think>I'm\nthinking</think>" + calls("special_function(arg1=1)"), "I'm\nthinking", "",
     SPECIAL),
    ("reasoning, content and a call", [T.get_time_tool],
     "<think>I need to call a function</think>Let me check the time."
     + calls('get_time(city="Paris")'), "I need to call a function", "Let me check the time.",
     [("get_time", {"city": "Paris"})]),
    ("a fake call marker in the reasoning", [T.special_function_tool],
     "<think>Let me think about " + calls("special_function(arg1=1)") + " hmm</think>"
     + calls("special_function(arg1=1)"),
     "Let me think about " + calls("special_function(arg1=1)") + " hmm", "", SPECIAL),
    ("reasoning with thinking off", [], "<think>I'm\nthinking</think>" + HELLO, "I'm\nthinking",
     HELLO, []),
]]  # fmt: skip


test_parser_matches_llama_cpp = parser_test(CASES, steps=(1, 9, 100_000))


def test_a_cut_off_call_counts_as_truncated() -> None:
    plan = plan_chat(template(TEMPLATES[0]), USER, ChatOptions(tools=(T.get_time_tool,)))
    parser = plan.parser()
    parser.feed('Sure.<|tool_call_start|>[get_time(city="Par')
    parser.finish()
    assert parser.num_truncated == 1


def test_python_calls_refuses_what_is_not_a_literal_call() -> None:
    for bad in ("[f(1)]", "[f(**x)]", "[f(a=b)]", "[f(a={1, 2})]", "[f(a=1j)]", "[1]", "[f(a="):
        with pytest.raises(ValueError):
            python_calls(bad)


TOOLS = [T.get_time_tool, T.special_function_tool_with_optional_param, T.config_tool]


@pytest.mark.parametrize("text", [
    calls('get_time(city="Paris")'),
    calls("get_time(city='Paris')"),
    "<think>hm</think>" + calls('get_time(city="Paris")'),
    calls("special_function_with_opt(arg2=2, arg1=1)"),
    calls('special_function_with_opt(arg1=1), get_time(city="x")'),
    calls('set_config(config={"a": [1, -2.5, "x", True, null]})'),
])  # fmt: skip
def test_required_grammar_accepts_calls(text: str) -> None:
    assert required_accepts(LFM2, TOOLS, text)


@pytest.mark.parametrize("text", [
    calls("get_time(city=Paris)"),  # a string parameter unquoted
    calls("get_time(city=3)"),  # a number for a string
    calls('other(city="x")'),  # not offered
    calls('get_time("Paris")'),  # positional
    HELLO + calls('get_time(city="x")'),  # text before a forced call
])  # fmt: skip
def test_required_grammar_rejects_malformed_calls(text: str) -> None:
    assert not required_accepts(LFM2, TOOLS, text)


def test_lazy_grammar_and_detection() -> None:
    spec = LFM25.grammar(TOOLS, ToolChoice("auto"), parallel=False)
    assert spec.lazy and spec.trigger_words == ("<|tool_call_start|>",)
    assert accepts(spec.gbnf, calls('get_time(city="Paris")'))
    assert not accepts(spec.gbnf, calls('get_time(city="a"), get_time(city="b")'))
    assert [detected(t) for t in TEMPLATES] == [LFM2, LFM25, LFM25]


@pytest.mark.parametrize("name", TEMPLATES)
def test_past_calls_render_as_the_grammar_reads_them(name: str) -> None:
    """LFM2.5-8B-A1B writes calls itself (strings single-quoted); the other two render
    content alone, so kvserve writes the calls into it (values as JSON)."""
    messages = past_calls([("get_time", '{"city": "Paris"}', "sunny"),
                           ("set_config", '{"config": {"on": true}}', "ok")])  # fmt: skip
    if name == THINKING:
        rendered = calls("get_time(city='Paris'), set_config(config={\"on\": true})")
    else:
        rendered = calls('get_time(city="Paris"), set_config(config={"on": true})')
    text = assert_renders(name, messages, tuple(TOOLS), rendered, LFM2)
    assert "sunny" in text and text.count("<|tool_call_start|>") == 1


@pytest.mark.parametrize("name", TEMPLATES)
def test_a_sampled_call_replays(name: str) -> None:
    sampled = "Sure." + calls('get_time(city="Paris")')
    first, second, _ = replayed(
        name, (T.get_time_tool,), sampled, [("get_time", '{"city": "Paris"}', "noon")]
    )
    assert second.startswith(first + sampled + "<|im_end|>\n")
    assert "noon" in second[len(first + sampled) :]
