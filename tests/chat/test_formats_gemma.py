"""Gemma 4's calls and thought channel, against the cases of llama.cpp's
tests/test-chat.cpp (the google-gemma-4-31B-it.jinja block and the #21760 prompt checks):
the plan's parser fed whole and one character at a time, the grammars checked by
llama.cpp's own grammar engine (tests/chat/gbnf_check.py), past calls rendered through
both Gemma 4 templates."""

from __future__ import annotations

import pytest

from chat.formats_gemma import GEMMA4
from chat.gemma_values import GemmaSyntaxError, gemma_json
from chat.plan import ChatOptions, plan_chat
from chat.reasoning import GEMMA4_THINKING, thinking_syntax
from chat.tools import Tool, ToolChoice
from tests.chat import llama_tools as T
from tests.chat.gbnf_check import accepts
from tests.chat.llama_cases import (
    HELLO,
    TEMPLATES,
    assert_renders,
    cases,
    detected,
    parser_test,
    past_calls,
    replayed,
    required_accepts,
    template,
    truncated,
)

G4 = "google-gemma-4-31B-it.jinja"
G4_OLD = "google-gemma-4-31B-it-interleaved.jinja"
THOUGHTS = "<|channel>thought\nI'm\nthinking<channel|>"


def call(name: str, args: str) -> str:
    return f"<|tool_call>call:{name}{{{args}}}<tool_call|>"


def q(text: str) -> str:
    return f'<|"|>{text}<|"|>'


# (the test-chat.cpp case, tools, output, reasoning, content, calls[, reasoning_format])
CASES = cases(G4, [
    ("content", [], "Hello, world!", "", "Hello, world!", []),
    ("reasoning and content", [], THOUGHTS + HELLO, "I'm\nthinking", HELLO, []),
    ("empty reasoning (budget 0)", [], "<|channel>thought<channel|>" + HELLO, "", HELLO, []),
    ("reasoning_format none", [], THOUGHTS + HELLO, "", THOUGHTS + HELLO, [], "none"),
    ("string argument", [T.get_time_tool], call("get_time", "city:" + q("London")), "", "",
     [("get_time", {"city": "London"})]),
    ("string with a blank", [T.get_time_tool], call("get_time", "city:" + q("San Francisco")),
     "", "", [("get_time", {"city": "San Francisco"})]),
    ("empty args", [T.empty_args_tool], call("empty_args", ""), "", "", [("empty_args", {})]),
    ("content and a call", [T.get_time_tool], HELLO + call("get_time", "city:" + q("Paris")),
     "", HELLO, [("get_time", {"city": "Paris"})]),
    ("a call after reasoning", [T.get_time_tool],
     THOUGHTS + call("get_time", "city:" + q("Paris")), "I'm\nthinking", "",
     [("get_time", {"city": "Paris"})]),
    ("parallel calls", [T.get_time_tool, T.get_weather_tool],
     call("get_time", "city:" + q("London")) + call("get_weather", "city:" + q("Paris")), "", "",
     [("get_time", {"city": "London"}), ("get_weather", {"city": "Paris"})]),
    ("integer", [T.special_function_tool], call("special_function", "arg1:42"), "", "",
     [("special_function", {"arg1": 42})]),
    ("negative number", [T.special_function_tool], call("special_function", "arg1:-7"), "", "",
     [("special_function", {"arg1": -7})]),
    ("decimal number", [T.amount_tool], call("amount", "orig:3.14"), "", "",
     [("amount", {"orig": 3.14})]),
    ("true", [T.toggle_tool], call("toggle", "enabled:true"), "", "", [("toggle", {"enabled": True})]),
    ("false", [T.toggle_tool], call("toggle", "enabled:false"), "", "",
     [("toggle", {"enabled": False})]),
    ("null", [T.nullable_tool], call("set_nullable", "value:null"), "", "",
     [("set_nullable", {"value": None})]),
    ("array", [T.todo_list], call("todo_list", f"todos:[{q('buy milk')},{q('walk dog')}]"), "", "",
     [("todo_list", {"todos": ["buy milk", "walk dog"]})]),
    ("dict", [T.config_tool], call("set_config", f"config:{{theme:{q('dark')},count:3}}"), "", "",
     [("set_config", {"config": {"theme": "dark", "count": 3}})]),
    ("empty array", [T.todo_list], call("todo_list", "todos:[]"), "", "", [("todo_list", {"todos": []})]),
    ("empty dict", [T.config_tool], call("set_config", "config:{}"), "", "",
     [("set_config", {"config": {}})]),
    ("scientific notation", [T.amount_tool], call("amount", "orig:1.5e10"), "", "",
     [("amount", {"orig": 1.5e10})]),
    ("edge: a trailing <channel|>", [], f"<|channel>thought\n<channel|>{HELLO}<channel|>", "", HELLO,
     []),
    ("edge: a trailing empty thought", [], f"<|channel>thought\n<channel|>{HELLO}"
     "<|channel>thought\n<channel|>", "", HELLO, []),
    ("edge: a trailing empty thought and <channel|>", [], f"<|channel>thought\n<channel|>{HELLO}"
     "<|channel>thought\n<channel|><channel|>", "", HELLO, []),
    ("edge: an empty channel first", [], f"<|channel><|channel>thought\n<channel|>{HELLO}", "",
     HELLO, []),
    # kvserve's own: a string may hold the call's end; a call cut off is not reported
    ("a string holding <tool_call|>", [T.python_tool], call("python", "code:" + q("x<tool_call|>")),
     "", "", [("python", {"code": "x<tool_call|>"})]),
    ("a call cut off", [T.python_tool], "<|tool_call>call:python{code:" + q("pri"), "", "", []),
])  # fmt: skip


test_parser_matches_llama_cpp = parser_test(CASES, steps=(1, 5, 100_000))


def test_a_cut_off_call_counts_as_truncated() -> None:
    assert truncated(G4, [T.python_tool], "Sure.<|tool_call>call:python{code:" + q("pri")) == 1


TWO = [T.get_time_tool, T.special_function_tool_with_optional_param]
TIME = call("get_time", "city:" + q("Paris"))


@pytest.mark.parametrize("text", [
    TIME,
    THOUGHTS + TIME,
    "<|channel>thought<channel|>" + TIME,
    call("special_function_with_opt", "arg1:1"),
    call("special_function_with_opt", "arg1:1,arg2:-2"),
    TIME + call("special_function_with_opt", "arg1:1"),
])  # fmt: skip
def test_required_grammar_accepts_calls(text: str) -> None:
    assert required_accepts(GEMMA4, TWO, text)


@pytest.mark.parametrize("text", [
    call("get_time", "city:3"),  # a string given a number
    call("get_time", 'city:"Paris"'),  # JSON's quotes, not Gemma's
    call("other", "city:" + q("Paris")),  # not offered
    call("get_time", ""),  # a required argument left out
    call("special_function_with_opt", "arg2:2,arg1:1"),  # out of the sorted order
    call("special_function_with_opt", "arg1:1,arg3:3"),  # not a parameter
    call("get_time", "city: " + q("Paris")),  # blanks the template never writes
    HELLO,  # no call
])  # fmt: skip
def test_required_grammar_rejects_malformed_calls(text: str) -> None:
    assert not required_accepts(GEMMA4, TWO, text)


def test_typed_values_nested() -> None:
    schema = {"type": "object", "required": ["a"], "properties": {
        "a": {"type": "array", "items": {"type": "object", "required": ["k"],
                                         "properties": {"k": {"enum": ["x", "y"]}}}},
        "b": {"type": ["integer", "null"]}, "c": {}}}  # fmt: skip
    spec = GEMMA4.grammar([Tool("f", "", schema)], ToolChoice("required"), parallel=False)
    assert accepts(spec.gbnf, call("f", f"a:[{{k:{q('x')}}},{{k:{q('y')}}}],b:null"))
    assert accepts(spec.gbnf, call("f", f"a:[],b:3,c:{{any:[1,{q('z')}]}}"))
    assert not accepts(spec.gbnf, call("f", f"a:[{{k:{q('z')}}}]"))  # not in the enum
    assert not accepts(spec.gbnf, call("f", "a:[],b:1.5"))  # not an integer


def test_a_string_keeps_its_schemas_length_and_holds_no_marker() -> None:
    # SmolLM2 under the unbounded grammar wrote city as 58 characters running into
    # `<|"|",properties:...`: the length is the schema's, and no value holds `<|`
    schema = {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "minLength": 2, "maxLength": 5},
        "note": {"type": "string"}}}  # fmt: skip
    spec = GEMMA4.grammar([Tool("f", "", schema)], ToolChoice("required"), parallel=False)
    for city in ("ab", "Paris", "a<b", "<<x", "ab<", "a|b"):
        assert accepts(spec.gbnf, call("f", "city:" + q(city))), city
    for city in ("a", "Parisx", "a<|b", '<|"|'):
        assert not accepts(spec.gbnf, call("f", "city:" + q(city))), city
    assert accepts(spec.gbnf, call("f", "city:" + q("ab") + ",note:" + q("x" * 300 + "<a<")))
    assert not accepts(spec.gbnf, call("f", "city:" + q("ab") + ",note:" + q('x<|"|,y')))
    at_least = GEMMA4.grammar([Tool("g", "", {"type": "object", "required": ["s"], "properties": {
        "s": {"type": "string", "minLength": 3}}})], ToolChoice("required"), parallel=False)  # fmt: skip
    assert accepts(at_least.gbnf, call("g", "s:" + q("abc" + "d<" * 40)))
    assert not accepts(at_least.gbnf, call("g", "s:" + q("ab")))
    assert not accepts(at_least.gbnf, call("g", "s:" + q("abc<|d")))


def test_lazy_grammar_and_parallel_off() -> None:
    spec = GEMMA4.grammar(TWO, ToolChoice("auto"), parallel=False)
    assert spec.lazy and spec.trigger_words == ("<|tool_call>",)
    assert accepts(spec.gbnf, TIME)
    assert not accepts(spec.gbnf, TIME + TIME)
    named = GEMMA4.grammar(TWO, ToolChoice("named", "get_time"), parallel=True)
    assert accepts(named.gbnf, TIME)


def test_custom_tool_input() -> None:
    from chat.tools import InputGrammar

    tool = Tool("shell", "", {"type": "object"}, InputGrammar("regex", "ls( -l)?"))
    spec = GEMMA4.grammar([tool], ToolChoice("required"), parallel=False)
    assert accepts(spec.gbnf, call("shell", "input:" + q("ls -l")))
    assert not accepts(spec.gbnf, call("shell", "input:" + q("rm")))


def test_detection_and_thinking_syntax() -> None:
    for name in (G4, G4_OLD):
        assert detected(name) is GEMMA4
        assert thinking_syntax((TEMPLATES / name).read_text()) is GEMMA4_THINKING
    assert detected("google-gemma-2-2b-it.jinja").name == "generic"


@pytest.mark.parametrize("name", [G4, G4_OLD])
def test_past_calls_render_as_the_grammar_writes_them(name: str) -> None:
    messages = past_calls([("special_function_with_opt", '{"arg2": 2, "arg1": 1}', '{"r": "ok"}'),
                           ("get_time", '{"city": "Paris"}', "sunny")])  # fmt: skip
    rendered = (call("special_function_with_opt", "arg1:1,arg2:2")
                + call("get_time", "city:" + q("Paris")))  # fmt: skip
    text = assert_renders(name, messages, tuple(TWO), rendered, GEMMA4)
    # the results follow the calls in Gemma's own blocks (the older template reads them
    # only as the turn's tool_responses: folded, as llama.cpp does), never as a tool turn
    assert "<|tool_response>response:special_function_with_opt{" in text
    assert "<|tool_response>response:get_time{value:" + q("sunny") + "}<tool_response|>" in text
    assert "<|turn>tool" not in text


def test_generation_prompt_after_results_and_text() -> None:
    """test-chat.cpp's #21760 checks: a turn with text, a call and its result is followed
    by the model's turn; without add_generation_prompt, nothing is added."""
    messages = past_calls([("special_function", '{"arg1": 1}', '{"r":"ok"}')], user="Hi")
    messages[1]["content"] = "Let me check."
    plan = plan_chat(template(G4), messages, ChatOptions(tools=(T.special_function_tool,)))
    assert plan.prompt.text.endswith("<turn|>\n<|turn>model\n")
    opts = ChatOptions(tools=(T.special_function_tool,), add_generation_prompt=False)
    assert not plan_chat(template(G4), messages, opts).prompt.text.endswith("<|turn>model\n")


@pytest.mark.parametrize("name", [G4, G4_OLD])
def test_a_sampled_call_replays_before_its_results(name: str) -> None:
    """A call turn sent back renders as it was sampled (chat/replay.py), after the prompt
    it was sampled after (the empty thought included, which the template leaves out of a
    past turn), and its results follow it: the KV reaches past the call."""
    tools = (T.get_time_tool,)
    sampled = call("get_time", "city:" + q("Paris"))
    first, second, history = replayed(
        name, tools, sampled, [("get_time", '{"city": "Paris"}', "noon")]
    )
    results = "<|tool_response>response:get_time{value:" + q("noon") + "}<tool_response|>"
    assert second.startswith(first + sampled + results)
    assert "kvserve" not in second
    unreplayed = plan_chat(template(name), history, ChatOptions(tools=tools)).prompt.text
    assert not unreplayed.startswith(first)


def test_results_after_a_turn_without_calls_are_kept() -> None:
    """A turn with text and no calls followed by results: its text, then the results."""
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Text."},
                {"role": "tool", "tool_call_id": "c1", "name": "f", "content": "done"}]  # fmt: skip
    text = plan_chat(template(G4), messages, ChatOptions()).prompt.text
    assert "<|turn>model\nText.<|tool_response>response:f{value:" + q("done") + "}" in text


def test_gemma_json() -> None:
    assert gemma_json(f"{{a:{q('x, y')},b:[1, true,None], {q('c')}: {{}}}}") == {
        "a": "x, y", "b": [1, True, None], "c": {}}  # fmt: skip
    for bad in ("{a:1", "{a 1}", f"{{a:{q('x')}", "{a:wat}"):
        with pytest.raises(GemmaSyntaxError):
            gemma_json(bad)
