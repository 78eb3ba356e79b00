"""MiniMax-M3's namespaced `<invoke>` calls and `<mm:think>` thinking, against the cases
of llama.cpp's tests/test-chat.cpp (the MiniMax-M3 block): the plan's parser fed whole
and in pieces, the grammars checked by llama.cpp's own grammar engine
(tests/chat/gbnf_check.py), past calls rendered through the template. Not ported: the
two continuation cases (an assistant prefill continues as plain text here)."""

from __future__ import annotations

import pytest

from chat.formats_minimax import MINIMAX_M3
from chat.minimax_values import NS, MinimaxSyntaxError, minimax_json
from chat.plan import ChatOptions, plan_chat
from chat.reasoning import MINIMAX_THINKING, thinking_syntax
from chat.tools import Tool, ToolChoice
from tests.chat import llama_tools as T
from tests.chat.gbnf_check import accepts
from tests.chat.llama_cases import (
    HELLO,
    SPECIAL,
    TEMPLATES,
    USER,
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

M3 = "MiniMax-M3.jinja"


def el(key: str, value: str) -> str:
    return f"{NS}<{key}>{value}{NS}</{key}>"


def invoke(name: str, body: str = "") -> str:
    return f'{NS}<invoke name="{name}">{body}{NS}</invoke>\n'


def block(*calls: str) -> str:
    return f"{NS}<tool_call>\n" + "".join(calls) + f"{NS}</tool_call>"


def think(text: str) -> str:
    return f"<mm:think>{text}</mm:think>"


TIME = block(invoke("get_time", el("city", "Tokyo")))
SPECIAL_BLOCK = block(invoke("special_function", el("arg1", "1")))

# (the test-chat.cpp case, tools, output, reasoning, content, calls[, reasoning_format])
CASES = cases(M3, [
    ("content only", [], "</mm:think>" + HELLO, "", HELLO, []),
    ("thinking and content", [], think("I'm\nthinking") + HELLO, "I'm\nthinking", HELLO, []),
    ("thinking and a call", [T.get_time_tool], think("Let me check the time") + TIME,
     "Let me check the time", "", [("get_time", {"city": "Tokyo"})]),
    ("a call without reasoning", [T.special_function_tool], "</mm:think>" + SPECIAL_BLOCK,
     "", "", SPECIAL),
    ("no parameters", [T.empty_args_tool], think("Let's call a tool:")
     + block(invoke("empty_args")), "Let's call a tool:", "", [("empty_args", {})]),
    ("parallel calls", [T.get_time_tool, T.get_weather_tool], think("Calling both")
     + block(invoke("get_time", el("city", "Paris")), invoke("get_weather", el("city", "Paris"))),
     "Calling both", "", [("get_time", {"city": "Paris"}), ("get_weather", {"city": "Paris"})]),
    ("content before the block", [T.special_function_tool], think("Thinking about it")
     + "Let me call the function." + SPECIAL_BLOCK, "Thinking about it",
     "Let me call the function.", SPECIAL),
    ("negative number", [T.magic_int_tool], think("Test negative")
     + block(invoke("magic_int", el("ref", "-14"))), "Test negative", "",
     [("magic_int", {"ref": -14})]),
    ("decimal number", [T.amount_tool], think("Test decimal")
     + block(invoke("amount", el("orig", "3.14"))), "Test decimal", "", [("amount", {"orig": 3.14})]),
    ("boolean", [T.toggle_tool], think("Test boolean")
     + block(invoke("toggle", el("enabled", "true"))), "Test boolean", "",
     [("toggle", {"enabled": True})]),
    ("mixed types", [T.magic_int_tool], think("Multi-arg call")
     + block(invoke("magic_int", el("ref", "42") + el("name", "foo bar"))), "Multi-arg call", "",
     [("magic_int", {"ref": 42, "name": "foo bar"})]),
    ("nested object", [T.imaginary_number_tool], think("Nested object")
     + block(invoke("imaginary_number", el("number", el("real", "1.5") + el("imaginary", "-2.5")))),
     "Nested object", "", [("imaginary_number", {"number": {"real": 1.5, "imaginary": -2.5}})]),
    ("nested arrays", [T.nested_args_tool], think("Nested arrays")
     + block(invoke("nested_args", el("tags", el("item", "alpha") + el("item", "beta"))
                    + el("entries", el("item", el("id", "1") + el("label", "one"))))),
     "Nested arrays", "",
     [("nested_args", {"tags": ["alpha", "beta"], "entries": [{"id": 1, "label": "one"}]})]),
    ("union array", [T.union_args_tool], think("Union array")
     + block(invoke("union_args", el("filter", el("item", "alpha") + el("item", "beta")))),
     "Union array", "", [("union_args", {"filter": ["alpha", "beta"]})]),
    ("union scalar", [T.union_args_tool], think("Union scalar")
     + block(invoke("union_args", el("limit", "5"))), "Union scalar", "",
     [("union_args", {"limit": 5})]),
    ("union nested", [T.union_args_tool], think("Union nested")
     + block(invoke("union_args", el("limit", el("max", "10")))), "Union nested", "",
     [("union_args", {"limit": {"max": 10}})]),
    ("union string", [T.union_args_tool], think("Union string")
     + block(invoke("union_args", el("label", "hi"))), "Union string", "",
     [("union_args", {"label": "hi"})]),
    ("union string that looks structured", [T.union_args_tool], think("Union string")
     + block(invoke("union_args", el("label", el("text", "hi")))), "Union string", "",
     [("union_args", {"label": el("text", "hi")})]),
    ("empty reasoning and a call", [T.get_time_tool],
     think("") + block(invoke("get_time", el("city", "XYZCITY"))), "", "",
     [("get_time", {"city": "XYZCITY"})]),
    # kvserve's own: reasoning_format none; no tools; a call cut off; not offered
    ("reasoning_format none", [], think("hm") + HELLO, "", think("hm") + HELLO, [], "none"),
    ("no tools offered", [], "</mm:think>" + SPECIAL_BLOCK, "", SPECIAL_BLOCK, []),
    ("a call cut off", [T.get_time_tool], "</mm:think>" + f'{NS}<tool_call>\n{NS}<invoke name="'
     f'get_time">{NS}<city>Tok', "", "", []),
    ("a string value with a number's text", [T.magic_int_tool],
     block(invoke("magic_int", el("ref", "7") + el("name", "12"))), "", "",
     [("magic_int", {"ref": 7, "name": "12"})]),
])  # fmt: skip


test_parser_matches_llama_cpp = parser_test(CASES, steps=(1, 7, 100_000))


def test_a_cut_off_call_counts_as_truncated() -> None:
    cut = f'Sure.{NS}<tool_call>\n{NS}<invoke name="get_time">{NS}<city>Tok'
    assert truncated(M3, [T.get_time_tool], cut) == 1


def test_minimax_json() -> None:
    """Without a schema (a tool not offered) the elements' shape decides."""
    body = el("a", "1") + el("b", "x y") + el("c", el("item", "2")) + el("d", el("k", "true"))
    assert minimax_json(body, None) == {"a": 1, "b": "x y", "c": [2], "d": {"k": True}}
    with pytest.raises(MinimaxSyntaxError):
        minimax_json(el("ref", "x"), T.magic_int_tool.parameters)  # not an integer
    with pytest.raises(MinimaxSyntaxError):
        minimax_json(f"{NS}<ref>1", T.magic_int_tool.parameters)  # unclosed


ALL = [T.get_time_tool, T.magic_int_tool, T.nested_args_tool, T.union_args_tool,
       T.imaginary_number_tool, T.empty_args_tool]  # fmt: skip


@pytest.mark.parametrize("text", [
    TIME,
    think("hm") + TIME,
    "</mm:think>" + TIME,
    block(invoke("magic_int", el("ref", "-14") + el("name", "foo bar"))),
    block(invoke("nested_args", el("tags", el("item", "a")) + el("entries", ""))),
    block(invoke("nested_args", el("tags", "") + el("entries", el("item", el("id", "1")
                                                                       + el("label", "x")))))
    + "",
    block(invoke("union_args", el("limit", el("max", "3")) + el("label", el("text", "x")))),
    block(invoke("union_args", el("filter", el("field", "a") + el("op", "=")))),
    block(invoke("imaginary_number", el("number", el("real", "1") + el("imaginary", "2")))),
    block(invoke("empty_args"), invoke("get_time", el("city", "Paris"))),
])  # fmt: skip
def test_required_grammar_accepts_calls(text: str) -> None:
    assert required_accepts(MINIMAX_M3, ALL, text)


@pytest.mark.parametrize("text", [
    block(invoke("magic_int", el("ref", "x"))),  # not an integer
    block(invoke("magic_int", el("name", "a"))),  # the required one left out
    block(invoke("magic_int", el("name", "a") + el("ref", "1"))),  # optional before required
    block(invoke("other", el("city", "x"))),  # not offered
    block(invoke("get_time", el("town", "x"))),  # not a parameter
    block(invoke("imaginary_number", el("number", '{"real": 1, "imaginary": 2}'))),  # JSON
    "<tool_call>" + '{"name": "get_time", "arguments": {"city": "x"}}</tool_call>',  # Hermes
    HELLO + TIME,  # text before a forced call
])  # fmt: skip
def test_required_grammar_rejects_malformed_calls(text: str) -> None:
    assert not required_accepts(MINIMAX_M3, ALL, text)


def test_lazy_grammar_and_parallel_off() -> None:
    spec = MINIMAX_M3.grammar(ALL, ToolChoice("auto"), parallel=False)
    assert spec.lazy and spec.trigger_words == (f"{NS}<tool_call>",)
    assert accepts(spec.gbnf, TIME)
    assert not accepts(spec.gbnf, block(invoke("get_time", el("city", "a")),
                                        invoke("get_time", el("city", "b"))))  # fmt: skip


def test_detection_and_thinking_syntax() -> None:
    assert detected(M3) is MINIMAX_M3
    assert detected("MiniMax-M2.jinja") is not MINIMAX_M3
    assert thinking_syntax((TEMPLATES / M3).read_text()) is MINIMAX_THINKING


def test_past_calls_render_as_the_grammar_writes_them() -> None:
    messages = past_calls([("magic_int", '{"ref": 42, "name": "foo bar"}', "ok"),
                           ("nested_args", '{"tags": ["a"], "entries": [{"id": 1, "label": "x"}]}',
                            "fine")])  # fmt: skip
    rendered = block(invoke("magic_int", el("ref", "42") + el("name", "foo bar")),
                     invoke("nested_args", el("tags", el("item", "a"))
                            + el("entries", el("item", el("id", "1") + el("label", "x")))))  # fmt: skip
    text = assert_renders(M3, messages, tuple(ALL), rendered, MINIMAX_M3)
    assert "]~b]tool\n<response>ok</response>\n<response>fine</response>" in text


def test_a_sampled_call_replays() -> None:
    """A call turn sent back renders as it was sampled (chat/replay.py): the second
    prompt extends the first by the sampled text, so its KV reaches past the call."""
    sampled = think("check") + block(invoke("get_time", el("city", "Tokyo")))
    first, second, _ = replayed(
        M3, (T.get_time_tool,), sampled, [("get_time", '{"city": "Tokyo"}', "noon")]
    )
    assert second.startswith(first + sampled + "[e~[\n]~b]tool\n<response>noon</response>")
    assert "kvserve" not in second


def test_custom_tool_input() -> None:
    """A custom tool's input is one raw-text element held to its grammar, read as a
    string even where it looks like a number."""
    from chat.tools import InputGrammar
    from tests.chat.parse_run import run

    tool = Tool("shell", "", {"type": "object"}, InputGrammar("regex", "ls( -l)?|[0-9]+"))
    spec = MINIMAX_M3.grammar([tool], ToolChoice("required"), parallel=False)
    assert accepts(spec.gbnf, block(invoke("shell", el("input", "ls -l"))))
    assert not accepts(spec.gbnf, block(invoke("shell", el("input", "rm"))))
    parser = plan_chat(template(M3), USER, ChatOptions(tools=(tool,))).parser()
    got = run(parser, "</mm:think>" + block(invoke("shell", el("input", "12"))), 100)
    assert got["tool_calls"] == [("shell", {"input": "12"})]
