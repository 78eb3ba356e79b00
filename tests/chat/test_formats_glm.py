"""GLM 4.6 and 4.7 Flash calls, against the cases of llama.cpp's tests/test-chat.cpp (the
GLM-4.6.jinja and GLM-4.7-Flash.jinja blocks): the plan's parser (thinking split
included) fed whole and one character at a time, the grammars checked by llama.cpp's
own grammar engine (tests/chat/gbnf_check.py), past calls rendered through the templates."""

from __future__ import annotations

from typing import Any

import pytest

from chat.formats_glm import GLM_45, GLM_47
from chat.plan import ChatOptions, plan_chat
from chat.tools import Tool, ToolChoice
from tests.chat import llama_tools as T
from tests.chat.gbnf_check import accepts
from tests.chat.llama_cases import (
    HELLO,
    SPECIAL,
    ParseCase,
    SwitchedRow,
    assert_renders,
    detected,
    parser_test,
    past_calls,
    required_accepts,
    template,
)

G46, G47 = "GLM-4.6.jinja", "GLM-4.7-Flash.jinja"
NO_ARGS = Tool(
    "read_file_diff_md",
    "Reads a file diff",
    {
        "type": "object",
        "properties": {"review_id": {"type": "string"}, "file_id": {"type": "string"}},
    },
)


def call(name: str, *args: tuple[str, str], nl: str = "") -> str:
    body = "".join(f"<arg_key>{k}</arg_key>{nl}<arg_value>{v}</arg_value>{nl}" for k, v in args)
    return f"<tool_call>{name}{nl if args else ''}{body}</tool_call>"


# (the test-chat.cpp case, template, thinking, tools, output, reasoning, content, calls)
ROWS: list[SwitchedRow] = [
    ("GLM-4.6: a call", G46, False, [T.special_function_tool],
     call("special_function", ("arg1", "1"), nl="\n"), "", "", SPECIAL),
    ("GLM-4.6: thinking, then a call", G46, True, [T.special_function_tool],
     "\n<think>I'm\nthinking</think>\n" + call("special_function", ("arg1", "1"), nl="\n"),
     "I'm\nthinking", "", SPECIAL),
    ("4.7 Flash: pure content", G47, False, [], HELLO, "", HELLO, []),
    ("4.7 Flash: reasoning with content", G47, True, [], "I'm\nthinking</think>" + HELLO,
     "I'm\nthinking", HELLO, []),
    ("4.7 Flash: tool call without reasoning", G47, False, [T.special_function_tool],
     call("special_function", ("arg1", "1")), "", "", SPECIAL),
    ("4.7 Flash: tool call with reasoning", G47, True, [T.special_function_tool],
     "I'm\nthinking</think>" + call("special_function", ("arg1", "1")), "I'm\nthinking", "",
     SPECIAL),
    ("4.7 Flash: parallel calls", G47, False,
     [T.special_function_tool, T.special_function_tool_with_optional_param],
     call("special_function", ("arg1", "1"))
     + call("special_function_with_opt", ("arg1", "1"), ("arg2", "2")), "", "",
     SPECIAL + [("special_function_with_opt", {"arg1": 1, "arg2": 2})]),
    ("4.7 Flash: #20650 a call without arguments", G47, True, [NO_ARGS],
     "Let me read the diff content.</think><tool_call>read_file_diff_md</tool_call>",
     "Let me read the diff content.", "", [("read_file_diff_md", {})]),
]  # fmt: skip
CASES = [ParseCase.switched(("enable_thinking",), *c) for c in ROWS]


test_parser_matches_llama_cpp = parser_test(CASES, steps=(1, 5, 100_000))


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        (
            GLM_45,
            call("edit", ("filename", "a.c"), ("oldString", "x"), ("newString", "y"), nl="\n"),
        ),
        (
            GLM_45,
            call("edit", ("newString", "y"), ("filename", "a.c"), ("oldString", "x"), nl="\n"),
        ),
        (GLM_45, "\n<think>hm</think>\n" + call("python", ("code", "a < b\n"), nl="\n")),
        (GLM_47, call("python", ("code", "print(1)")) + call("python", ("code", "x"))),
        (GLM_47, "ok</think>" + call("python", ("code", "print(1)"))),
    ],
)
def test_required_grammar_accepts_calls(fmt: Any, text: str) -> None:
    assert required_accepts(fmt, [T.edit_tool, T.python_tool], text)


@pytest.mark.parametrize(
    "text",
    [
        call("special_function", ("arg1", "one"), nl="\n"),  # an integer given text
        call("special_function", ("arg2", "1"), nl="\n"),  # not a parameter of it
        call("special_function", nl="\n"),  # the required argument missing
        call("special_function", ("arg1", "1")),  # GLM 4.6 writes the newlines
        '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>',
    ],
)
def test_required_grammar_rejects_malformed_calls(text: str) -> None:
    assert not required_accepts(GLM_45, [T.special_function_tool], text)


def test_a_string_value_cannot_contain_its_closing_tag() -> None:
    spec = GLM_47.grammar([T.python_tool], ToolChoice("required"), parallel=False)
    assert accepts(spec.gbnf, call("python", ("code", "a </arg_valu> b")))
    assert not accepts(spec.gbnf, call("python", ("code", "a </arg_value> b")))


def test_lazy_grammar_and_parallel_off() -> None:
    spec = GLM_47.grammar([T.python_tool], ToolChoice("auto"), parallel=False)
    assert spec.lazy and spec.trigger_patterns == (r"[\s\S]*?(<tool_call>)[\s\S]*",)
    one = call("python", ("code", "1"))
    assert accepts(spec.gbnf, one) and not accepts(spec.gbnf, one + one)


@pytest.mark.parametrize(("name", "fmt"), [(G46, GLM_45), (G47, GLM_47)])
def test_detection_from_llama_cpp_templates(name: str, fmt: object) -> None:
    assert detected(name) is fmt


HISTORY = past_calls([("special_function", '{"arg1": 1}', "ok"),
                      ("python", '{"code": "print(1)"}', "1")])  # fmt: skip
TOOLS = (T.special_function_tool, T.python_tool)


@pytest.mark.parametrize(
    ("name", "fmt", "rendered"),
    [
        (
            G46,
            GLM_45,
            call("special_function", ("arg1", "1"), nl="\n")
            + "\n"
            + call("python", ("code", "print(1)"), nl="\n"),
        ),  # fmt: skip
        (
            G47,
            GLM_47,
            call("special_function", ("arg1", "1")) + call("python", ("code", "print(1)")),
        ),
    ],
)
def test_past_calls_render_as_the_grammar_writes_them(name: str, fmt: Any, rendered: str) -> None:
    # the arguments reach the template as a mapping (it iterates `arguments.items()`)
    assert_renders(name, HISTORY, TOOLS, rendered, fmt)


# The other templates llama.cpp ships with these tags: detected by the same rule, and
# their rendered calls are what the detected form's grammar writes.
SAME_TAGS = {
    "Spark2.5.jinja": GLM_47,
    "inclusionai-ling-3.0-flash.jinja": GLM_45,
    "poolside-Laguna-S-2.1.jinja": GLM_47,
    "poolside-Laguna-XS-2.1.jinja": GLM_45,
    "poolside-Laguna-XS.2.jinja": GLM_45,
}


@pytest.mark.parametrize(("name", "fmt"), SAME_TAGS.items())
def test_templates_with_the_same_tags(name: str, fmt: Any) -> None:
    assert detected(name) is fmt
    text = plan_chat(template(name), HISTORY, ChatOptions(tools=TOOLS)).prompt.text
    start = text.index("<tool_call>special_function")
    calls = text[start : text.rindex("</tool_call>") + len("</tool_call>")]
    assert accepts(fmt.grammar(list(TOOLS), ToolChoice("required"), True).gbnf, calls)
