"""Cohere2 MoE's blocks (`<|START_TEXT|>` answers, `<|START_ACTION|>` call lists, the
thinking its prompt opens), against the cases of llama.cpp's tests/test-chat.cpp (the
Cohere2MoE.jinja block): the plan's parser fed whole and in pieces, the grammars checked
by llama.cpp's own grammar engine (tests/chat/gbnf_check.py), past calls rendered
through the template. Not ported: the response-format case's schema (the parser reads
the answer block whatever it holds; kvserve's own grammar case below covers the
document)."""

from __future__ import annotations

import pytest

from chat.formats_cohere import COHERE2_MOE
from chat.plan import ChatOptions, plan_chat
from chat.reasoning import COHERE_THINKING, thinking_syntax
from chat.tools import ToolChoice
from tests.chat import llama_tools as T
from tests.chat.gbnf_check import accepts
from tests.chat.llama_cases import (
    HELLO,
    SPECIAL,
    TEMPLATES,
    USER,
    cases,
    detected,
    parser_test,
    past_calls,
    required_accepts,
    template,
    truncated,
)

MOE = "Cohere2MoE.jinja"
END = "<|END_THINKING|>"
ANSWER = f"<|START_TEXT|>{HELLO}<|END_TEXT|>"
SPECIAL_JSON = '{"tool_call_id": "0", "tool_name": "special_function", "parameters": {"arg1": 1}}'
PYTHON_JSON = '{"tool_call_id": "1", "tool_name": "python", "parameters": {"code": "print(\'hey\')"}}'


def action(*calls: str) -> str:
    return "<|START_ACTION|>[\n" + ",\n".join(f"    {c}" for c in calls) + "\n]<|END_ACTION|>"


TODO = '{"tool_call_id": "0", "tool_name": "todo_list", "parameters": {"todos": ["buy milk", "walk dog"]}}'
INVOICE = '{"amount": 123.45, "date": "2025-12-03"}'

# (the test-chat.cpp case, tools, output, reasoning, content, calls[, reasoning_format])
CASES = cases(MOE, [
    ("content with reasoning", [], "I'm\nthinking" + END + ANSWER, "I'm\nthinking", HELLO, []),
    # llama.cpp's content also starts with the <|START_THINKING|> its prompt wrote
    ("reasoning_format none", [], "I'm\nthinking" + END + ANSWER, "",
     "I'm\nthinking" + END + HELLO, [], "none"),
    ("empty thinking block", [], END + ANSWER, "", HELLO, []),
    ("JSON output", [T.special_function_tool], "I need to output the invoice details in JSON"
     + END + f"<|START_TEXT|>{INVOICE}<|END_TEXT|>",
     "I need to output the invoice details in JSON", INVOICE, []),
    ("a call with reasoning", [T.special_function_tool], "I'm\nthinking" + END
     + action(SPECIAL_JSON), "I'm\nthinking", "", SPECIAL),
    ("a call, empty thinking", [T.special_function_tool], END + action(SPECIAL_JSON), "", "",
     SPECIAL),
    ("an array argument", [T.todo_list], END + action(TODO), "", "",
     [("todo_list", {"todos": ["buy milk", "walk dog"]})]),
    ("parallel calls", [T.special_function_tool, T.python_tool], "I'm\nthinking" + END
     + action(SPECIAL_JSON, PYTHON_JSON), "I'm\nthinking", "",
     [*SPECIAL, ("python", {"code": "print('hey')"})]),
    ("tools offered, content", [T.special_function_tool], "I'm\nthinking" + END + ANSWER,
     "I'm\nthinking", HELLO, []),
    # kvserve's own: thinking off (the prompt closed the block); a call cut off
    ("thinking off, a call", [T.special_function_tool], action(SPECIAL_JSON), "", "", SPECIAL),
    ("thinking off, content", [], ANSWER, "", HELLO, []),
    ("a call cut off", [T.special_function_tool], END + action(SPECIAL_JSON)[:40], "", "", []),
])  # fmt: skip


test_parser_matches_llama_cpp = parser_test(CASES, steps=(1, 7, 100_000))


def test_the_prompt_opens_the_thinking() -> None:
    """What the parser relies on: the generation prompt ends inside the thinking block
    (or, thinking off, with an empty one)."""
    on = plan_chat(template(MOE), USER, ChatOptions()).prompt.text
    assert on.endswith("<|CHATBOT_TOKEN|><|START_THINKING|>")
    off = plan_chat(template(MOE), USER, ChatOptions(template_kwargs={"reasoning": False}))
    assert off.prompt.text.endswith("<|START_THINKING|><|END_THINKING|>")


def test_a_cut_off_call_counts_as_no_call() -> None:
    """An action list is read when it closes, as Command R7B's (nothing to report before)."""
    assert truncated(MOE, [T.special_function_tool], END + action(SPECIAL_JSON)[:40]) == 0


TWO = [T.special_function_tool, T.python_tool]


@pytest.mark.parametrize("text", [
    action(SPECIAL_JSON),
    "plan" + END + action(SPECIAL_JSON),
    "<|START_THINKING|>plan" + END + action(SPECIAL_JSON, PYTHON_JSON),
])  # fmt: skip
def test_required_grammar_accepts_calls(text: str) -> None:
    assert required_accepts(COHERE2_MOE, TWO, text)


@pytest.mark.parametrize("text", [
    action(SPECIAL_JSON.replace('"arg1": 1', '"arg1": "x"')),  # an integer given text
    action(SPECIAL_JSON.replace("special_function", "other")),  # not offered
    ANSWER,  # no call
])  # fmt: skip
def test_required_grammar_rejects_malformed_calls(text: str) -> None:
    assert not required_accepts(COHERE2_MOE, TWO, text)


def test_lazy_grammar_and_a_document() -> None:
    spec = COHERE2_MOE.grammar(TWO, ToolChoice("auto"), parallel=False)
    assert spec.lazy and spec.trigger_words == ("<|START_ACTION|>",)
    assert accepts(spec.gbnf, action(SPECIAL_JSON))
    assert not accepts(spec.gbnf, action(SPECIAL_JSON, PYTHON_JSON))
    document = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    with_doc = COHERE2_MOE.grammar(TWO, ToolChoice("auto"), True, document)
    assert not with_doc.lazy
    assert accepts(with_doc.gbnf, "plan" + END + '<|START_TEXT|>{"a": 3}<|END_TEXT|>')
    assert not accepts(with_doc.gbnf, "plan" + END + '<|START_RESPONSE|>{"a": 3}<|END_RESPONSE|>')


def test_detection_and_thinking_syntax() -> None:
    assert detected(MOE) is COHERE2_MOE
    assert detected("CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja") is not COHERE2_MOE
    assert thinking_syntax((TEMPLATES / MOE).read_text()) is COHERE_THINKING


def test_past_calls_render_as_the_grammar_writes_them() -> None:
    messages = past_calls([("special_function", '{"arg1": 1}', "ok"),
                           ("python", '{"code": "print(1)"}', "1")])  # fmt: skip
    text = plan_chat(template(MOE), messages, ChatOptions(tools=tuple(TWO))).prompt.text
    start = text.index("<|START_ACTION|>[")
    block = text[start : text.index("]<|END_ACTION|>", start) + len("]<|END_ACTION|>")]
    assert '"tool_name": "python", "parameters": {"code": "print(1)"}' in block
    assert required_accepts(COHERE2_MOE, TWO, block)
