"""Muse Glimmer's `to=` messages and ATEM call blocks, against the cases of llama.cpp's
tests/test-chat.cpp (the muse-glimmer.jinja block): the plan's parser fed whole and in
pieces, the grammars checked by llama.cpp's own grammar engine
(tests/chat/gbnf_check.py), past calls rendered through the template. The response
format cases are parser cases here (the answer's text is the content whatever the
schema)."""

from __future__ import annotations

import re

import pytest

from chat.formats_muse import MUSE_GLIMMER, TRIGGER
from chat.plan import ChatOptions, plan_chat
from chat.reasoning import MUSE_THINKING, thinking_syntax
from chat.tools import ToolChoice
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
    required_accepts,
    template,
    truncated,
)

MUSE = "muse-glimmer.jinja"
NEXT = "<|eom|><|start|>assistant"


def atem(name: str, *params: tuple[str, str]) -> str:
    body = "".join(f'<atem:parameter name="{k}">{v}</atem:parameter>\n' for k, v in params)
    return (f'<atem:function_calls>\n<atem:invoke name="{name}">\n{body}</atem:invoke>\n'
            "</atem:function_calls>")  # fmt: skip


MARKUP = atem("special_function", ("arg1", "1"))
CALL = " to=special_function<|message|>" + MARKUP
INVOICE = '{"amount": 123.45, "date": "2025-12-03"}'

# (the test-chat.cpp case, tools, output, reasoning, content, calls[, reasoning_format])
CASES = cases(MUSE, [
    ("a plain answer", [], f" to=user<|message|>{HELLO}<|eot|>", "", HELLO, []),
    ("a call first", [T.special_function_tool], CALL, "", "", SPECIAL),
    ("inform then act", [T.special_function_tool], f" to=user<|message|>{HELLO}{NEXT}{CALL}", "",
     HELLO, SPECIAL),
    ("markup quoted in an answer", [T.special_function_tool],
     f" to=user<|message|>You invoke it like this:\n{MARKUP}<|eot|>", "",
     "You invoke it like this:\n" + MARKUP, []),
    ("structured output", [], f" to=user<|message|>{INVOICE}", "", INVOICE, []),
    ("structured output after reasoning", [], " to=self<|message|>I need to output the invoice "
     f"details in JSON{NEXT} to=user<|message|>{INVOICE}",
     "I need to output the invoice details in JSON", INVOICE, []),
    ("markup in the reasoning", [T.special_function_tool], f" to=self<|message|>I could use "
     f"{MARKUP} here{NEXT} to=user<|message|>Hello!<|eot|>", f"I could use {MARKUP} here",
     "Hello!", []),
    # kvserve's own: parallel calls, typed values, no recipient, reasoning_format none
    ("parallel calls", [T.special_function_tool, T.python_tool], CALL + NEXT
     + " to=python<|message|>" + atem("python", ("code", "print(1)")), "", "",
     [*SPECIAL, ("python", {"code": "print(1)"})]),
    ("a string that looks like a number", [T.magic_int_tool], " to=magic_int<|message|>"
     + atem("magic_int", ("ref", "42"), ("name", "7")), "", "",
     [("magic_int", {"ref": 42, "name": "7"})]),
    ("no recipient", [], f"<|message|>{HELLO}<|eot|>", "", HELLO, []),
    ("reasoning_format none", [], f" to=self<|message|>hm{NEXT} to=user<|message|>{HELLO}",
     "", "hm" + HELLO, [], "none"),
    ("no tools offered", [], CALL, "", CALL.strip(), []),
])  # fmt: skip


test_parser_matches_llama_cpp = parser_test(CASES, steps=(1, 6, 100_000))


def test_a_cut_off_call_counts_as_truncated() -> None:
    assert truncated(MUSE, [T.special_function_tool], CALL[:-40]) == 1


TWO = [T.special_function_tool, T.python_tool]
PYTHON = " to=python<|message|>" + atem("python", ("code", "print(1)"))


@pytest.mark.parametrize("text", [
    CALL,
    CALL + NEXT + PYTHON,
    f" to=self<|message|>plan{NEXT}{CALL}",
])  # fmt: skip
def test_required_grammar_accepts_calls(text: str) -> None:
    assert required_accepts(MUSE_GLIMMER, TWO, text)


@pytest.mark.parametrize("text", [
    CALL.replace(">1<", ">x<"),  # not an integer
    " to=other<|message|>" + atem("other", ("arg1", "1")),  # not offered
    f" to=user<|message|>{HELLO}<|eot|>",  # no call
    f" to=self<|message|>plan<|eot|>{CALL}",  # the reasoning ends with <|eom|>
])  # fmt: skip
def test_required_grammar_rejects(text: str) -> None:
    assert not required_accepts(MUSE_GLIMMER, TWO, text)


def test_lazy_grammar_and_its_trigger() -> None:
    spec = MUSE_GLIMMER.grammar(TWO, ToolChoice("auto"), parallel=False)
    assert spec.lazy and spec.trigger_patterns == (TRIGGER,)
    assert accepts(spec.gbnf, CALL) and not accepts(spec.gbnf, CALL + NEXT + PYTHON)
    answer = f" to=user<|message|>{HELLO}{NEXT}{CALL}"
    found = re.fullmatch(TRIGGER, answer)
    assert found is not None and answer[found.start(1) :] == CALL
    assert re.fullmatch(TRIGGER, f" to=self<|message|>plan{NEXT} to=user<|message|>hi") is None


def test_a_document_or_calls() -> None:
    document = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    spec = MUSE_GLIMMER.grammar(TWO, ToolChoice("auto"), True, document)
    assert not spec.lazy
    assert accepts(spec.gbnf, f' to=self<|message|>plan{NEXT} to=user<|message|>{{"a": 1}}')
    assert accepts(spec.gbnf, CALL)


def test_detection_and_thinking_syntax() -> None:
    assert detected(MUSE) is MUSE_GLIMMER
    assert thinking_syntax((TEMPLATES / MUSE).read_text()) is MUSE_THINKING
    assert plan_chat(template(MUSE), USER, ChatOptions()).prompt.text.endswith("<|start|>assistant")


def test_past_calls_render_as_the_grammar_writes_them() -> None:
    messages = past_calls([("special_function", '{"arg1": 1}', "ok"),
                           ("python", '{"code": "print(1)"}', "fine")])  # fmt: skip
    rendered = "<|start|>assistant" + CALL + NEXT + PYTHON
    text = plan_chat(template(MUSE), messages, ChatOptions(tools=tuple(TWO))).prompt.text
    assert rendered + "<|eot|>" in text
    assert required_accepts(MUSE_GLIMMER, TWO, rendered.removeprefix("<|start|>assistant"))
    assert_renders(MUSE, messages, tuple(TWO), CALL + NEXT + PYTHON, MUSE_GLIMMER)
