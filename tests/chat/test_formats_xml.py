"""Qwen3-Coder's XML calls, against the cases of llama.cpp's tests/test-chat.cpp
("Qwen3-Coder (tool calling with XML-style format)" and the StepFun 3.5 Flash block):
the parser fed whole and one character at a time, the grammar checked by llama.cpp's
own grammar engine (tests/chat/gbnf_check.py), detection from the template files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chat.formats import HERMES, detect_format
from chat.formats_xml import QWEN3_CODER, QWEN3_XML
from chat.plan import ChatOptions, plan_chat
from chat.tagged_args import value_json, value_types
from chat.template import ChatTemplate
from chat.tools import Tool, ToolChoice
from tests.chat import llama_tools as T
from tests.chat.gbnf_check import accepts
from tests.chat.parse_run import parse

TEMPLATES = Path(__file__).parent / "templates"


def call(name: str, *params: tuple[str, str], bare: bool = False) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"{'' if bare else '<tool_call>' + chr(10)}<function={name}>\n{body}</function>\n</tool_call>"


ARG1 = call("special_function", ("arg1", "1"))
OPT = call("special_function_with_opt", ("arg1", "1"), ("arg2", "2"))
# (the test-chat.cpp case, tools, output, content, calls)
CASES: list[tuple[str, list[Tool], str, str, list[tuple[str, Any]]]] = [
    ("plain content", [], "Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", []),
    ("one call", [T.special_function_tool], ARG1, "", [("special_function", {"arg1": 1})]),
    ("skips the opening <tool_call>", [T.special_function_tool], ARG1.removeprefix("<tool_call>\n"),
     "", [("special_function", {"arg1": 1})]),
    ("Let me call it.", [T.special_function_tool],
     "Let me call it.\n" + ARG1.removeprefix("<tool_call>\n"), "Let me call it.\n",
     [("special_function", {"arg1": 1})]),
    ("only the first call may omit it",
     [T.special_function_tool, T.special_function_tool_with_optional_param],
     ARG1.removeprefix("<tool_call>\n") + "\n" + OPT, "",
     [("special_function", {"arg1": 1}), ("special_function_with_opt", {"arg1": 1, "arg2": 2})]),
    ("parallel calls", [T.special_function_tool, T.special_function_tool_with_optional_param],
     ARG1 + "\n" + OPT, "",
     [("special_function", {"arg1": 1}), ("special_function_with_opt", {"arg1": 1, "arg2": 2})]),
    ("code content (multiline)", [T.python_tool],
     call("python", ("code", 'def hello():\n    print("Hello, world!")\n\nhello()')), "",
     [("python", {"code": 'def hello():\n    print("Hello, world!")\n\nhello()'})]),
    ("asian unicode chars", [T.python_tool], call("python", ("code", "格")), "",
     [("python", {"code": "格"})]),
    ("HTML tag content", [T.html_tool],
     call("html", ("markup", "<html>\n <head>\n  <title>Hello!</title>\n </head>\n</html>")), "",
     [("html", {"markup": "<html>\n <head>\n  <title>Hello!</title>\n </head>\n</html>"})]),
    ("TODO list (array of objects)", [T.todo_list],
     call("todo_list", ("todos", '[{"item": "Check stuff", "selected": false}, {"item": "Prepare stuff", "selected": true}]')),
     "", [("todo_list", {"todos": [{"item": "Check stuff", "selected": False},
                                   {"item": "Prepare stuff", "selected": True}]})]),
    ("flexible required argument ordering", [T.edit_tool],
     call("edit", ("newString", "#include"), ("filename", "foo.c"), ("oldString", "#iclunde")), "",
     [("edit", {"newString": "#include", "filename": "foo.c", "oldString": "#iclunde"})]),
    ("2 required + 4 optional, required reversed", [T.tool_2req_4opt],
     call("tool_2req_4opt", ("req2", "42"), ("req1", "hello"), ("opt2", "200")), "",
     [("tool_2req_4opt", {"req2": 42, "req1": "hello", "opt2": 200})]),
    ("2 required + 5 optional, all 5 shuffled", [T.tool_2req_5opt],
     call("tool_2req_5opt", ("req1", "test"), ("req2", "99"), ("opt3", "c"), ("opt1", "a"),
          ("opt5", "e"), ("opt4", "4"), ("opt2", "2")), "",
     [("tool_2req_5opt", {"req1": "test", "req2": 99, "opt3": "c", "opt1": "a", "opt5": "e",
                          "opt4": 4, "opt2": 2})]),
    ("nullable string", [T.nullable_string_tool], call("set_nullable_str", ("name", "hello world")),
     "", [("set_nullable_str", {"name": "hello world"})]),
    ("nullable string, null first", [T.nullable_string_null_first_tool],
     call("set_nullable_str_nf", ("name", "hello world")), "",
     [("set_nullable_str_nf", {"name": "hello world"})]),
    ("nullable integer", [T.nullable_int_tool], call("set_nullable_int", ("count", "42")), "",
     [("set_nullable_int", {"count": 42})]),
    ("nullable string given null", [T.nullable_string_tool], call("set_nullable_str", ("name", "null")),
     "", [("set_nullable_str", {"name": None})]),
    ("unions with string", [T.string_union_tool],
     call("set_union", ("value", '{"a": 1}'), ("amount", "2 dollars")), "",
     [("set_union", {"value": {"a": 1}, "amount": "2 dollars"})]),
    ("unions with string, not JSON", [T.string_union_tool],
     call("set_union", ("value", "{not valid json"), ("amount", "42")), "",
     [("set_union", {"value": "{not valid json", "amount": 42})]),
    ("enum without explicit type", [T.enum_no_type_tool], call("set_unit", ("unit", "celsius")), "",
     [("set_unit", {"unit": "celsius"})]),
    ("StepFun: numeric-looking strings stay strings", [T.magic_tool],
     call("magic", ("name", "fooBar"), ("ref", "5123123")), "",
     [("magic", {"name": "fooBar", "ref": "5123123"})]),
]  # fmt: skip


@pytest.mark.parametrize("step", [1, 7, 100_000])
@pytest.mark.parametrize(
    ("case", "tools", "text", "content", "calls"), CASES, ids=[c[0] for c in CASES]
)
def test_parser_matches_llama_cpp(
    case: str, tools: list[Tool], text: str, content: str, calls: list[Any], step: int
) -> None:
    got = parse(QWEN3_CODER.parser(tools), text, step)
    assert got["content"] == content
    assert got["tool_calls"] == calls


@pytest.mark.parametrize(("case", "tools", "text", "content", "calls"),
                         [c for c in CASES if c[4] and not c[0].startswith("unions")],
                         ids=[c[0] for c in CASES if c[4] and not c[0].startswith("unions")])  # fmt: skip
def test_required_grammar_accepts_the_reference_calls(
    case: str, tools: list[Tool], text: str, content: str, calls: list[Any]
) -> None:
    spec = QWEN3_CODER.grammar(tools, ToolChoice("required"), parallel=True)
    assert not spec.lazy
    assert accepts(spec.gbnf, text.removeprefix(content))


def test_union_with_string_grammar_keeps_the_raw_text() -> None:
    # "unions with string": the grammar keeps only the raw string form for such a value
    spec = QWEN3_CODER.grammar([T.string_union_tool], ToolChoice("required"), parallel=False)
    assert accepts(spec.gbnf, call("set_union", ("value", "{not valid json"), ("amount", "42")))


@pytest.mark.parametrize(
    "text",
    [
        call("special_function", ("arg1", "one")),  # an integer parameter given text
        call("special_function", ("arg2", "1")),  # a parameter the schema does not name
        call("special_function"),  # the required parameter missing
        call("special_function", ("arg1", "1")).replace("</function>\n", ""),
        call("special_function_with_opt", ("arg1", "1")),  # not offered
        '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>',
    ],
)
def test_required_grammar_rejects_malformed_calls(text: str) -> None:
    spec = QWEN3_CODER.grammar([T.special_function_tool], ToolChoice("required"), parallel=True)
    assert not accepts(spec.gbnf, text)


def test_a_string_value_cannot_contain_the_closing_tag() -> None:
    spec = QWEN3_CODER.grammar([T.python_tool], ToolChoice("required"), parallel=False)
    assert accepts(spec.gbnf, call("python", ("code", "a </parameter> b\n</parameterx>")))
    assert not accepts(spec.gbnf, call("python", ("code", "a\n</parameter>\nb")))


def test_parallel_false_allows_one_call() -> None:
    tools = [T.special_function_tool, T.special_function_tool_with_optional_param]
    one = QWEN3_CODER.grammar(tools, ToolChoice("required"), parallel=False)
    assert accepts(one.gbnf, ARG1) and not accepts(one.gbnf, ARG1 + "\n" + OPT)


def test_lazy_grammar_in_auto_mode() -> None:
    spec = QWEN3_CODER.grammar([T.special_function_tool], ToolChoice("auto"), parallel=True)
    assert spec.lazy
    assert spec.trigger_patterns == (r"[\s\S]*?(<tool_call>)[\s\S]*",
                                     r"[\s\S]*?(<function=special_function>)[\s\S]*")  # fmt: skip
    # the grammar starts where the trigger's group does: at <tool_call>, or a bare <function=
    assert accepts(spec.gbnf, ARG1)
    assert accepts(spec.gbnf, ARG1.removeprefix("<tool_call>\n"))
    # the thinking templates (Qwen3.5, Nemotron 3, StepFun) always open with <tool_call>
    thinking = QWEN3_XML.grammar([T.special_function_tool], ToolChoice("auto"), parallel=True)
    assert len(thinking.trigger_patterns) == 1
    assert not accepts(thinking.gbnf, ARG1.removeprefix("<tool_call>\n"))


def test_truncated_call_is_not_reported() -> None:
    got = parse(QWEN3_CODER.parser([T.python_tool]), "Hi " + call("python", ("code", "x"))[:-25], 1)
    assert got == {"content": "Hi ", "reasoning_content": "", "tool_calls": []}


@pytest.mark.parametrize(
    ("text", "schema", "value"),
    [
        ("1", {"type": "integer"}, 1),
        ("True", {"type": "boolean"}, True),  # as the template's `|string` writes it
        ("1.5", {"type": ["integer", "string"]}, "1.5"),
        ("1.5", {"type": ["number", "string"]}, 1.5),
        ('"x"', {"type": ["string", "null"]}, '"x"'),
        ("[1]", {"anyOf": [{"type": "array"}, {"type": "string"}]}, [1]),
        ("abc", {"$ref": "#/$defs/s"}, "abc"),
    ],
)
def test_value_typing(text: str, schema: Any, value: Any) -> None:
    root = {"$defs": {"s": {"type": "string"}}}
    assert json.loads(value_json(text, value_types(schema, root))) == value


DETECTED = {
    "Qwen3-Coder.jinja": QWEN3_CODER,
    "Qwen3.5-4B.jinja": QWEN3_XML,
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja": QWEN3_XML,
    "StepFun3.5-Flash.jinja": QWEN3_XML,
    "Qwen-Qwen3-0.6B.jinja": HERMES,  # JSON in <tool_call>, as before
}


@pytest.mark.parametrize(("name", "fmt"), DETECTED.items())
def test_detection_from_llama_cpp_templates(name: str, fmt: object) -> None:
    assert detect_format((TEMPLATES / name).read_text()) is fmt


def qwen3_coder() -> ChatTemplate:
    source = (TEMPLATES / "Qwen3-Coder.jinja").read_text()
    return ChatTemplate(source, bos_token="", eos_token="<|im_end|>", add_bos=False)


def test_plan_renders_past_calls_in_xml_and_parses_new_ones() -> None:
    tools = (T.special_function_tool, T.python_tool)
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Run it"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {
                "name": "python", "arguments": json.dumps({"code": "print(1)"})}},
            {"id": "c2", "type": "function", "function": {
                "name": "special_function", "arguments": '{"arg1": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "1"},
        {"role": "tool", "tool_call_id": "c2", "content": "ok"},
    ]  # fmt: skip
    plan = plan_chat(qwen3_coder(), messages, ChatOptions(tools=tools))
    # arguments reach the template as a mapping (it iterates `arguments|items`)
    assert (
        "<tool_call>\n<function=python>\n<parameter=code>\nprint(1)\n</parameter>\n"
        "</function>\n</tool_call>\n<tool_call>\n<function=special_function>\n"
        "<parameter=arg1>\n1\n</parameter>\n</function>\n</tool_call><|im_end|>"
    ) in plan.prompt.text
    assert plan.prompt.text.endswith("<|im_start|>assistant\n")
    assert plan.grammar is not None and plan.grammar.lazy
    assert accepts(plan.grammar.gbnf, call("python", ("code", "print(2)")))
    out = plan.parser()
    deltas = out.feed("Sure.\n" + call("python", ("code", "print(2)"))) + out.finish()
    assert [d.kind for d in deltas] == ["content", "start", "args", "args", "args"]
    assert "".join(d.text for d in deltas if d.kind == "args") == '{"code": "print(2)"}'
