"""gpt-oss's harmony channels, against the "GPT-OSS format tests" of llama.cpp's
tests/test-chat.cpp (template models/templates/openai-gpt-oss-120b.jinja): the parser
fed whole and one character at a time, the grammars checked by llama.cpp's own grammar
engine (tests/chat/gbnf_check.py), the template's rendering through the planner."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from chat.formats import detect_format
from chat.harmony import HARMONY
from chat.plan import ChatOptions, plan_chat
from chat.reasoning import effort_kwargs
from chat.template import ChatTemplate
from chat.tools import Tool, ToolChoice
from tests.chat import llama_tools as T
from tests.chat.gbnf_check import accepts
from tests.chat.parse_run import parse

TEMPLATE = Path(__file__).parent / "templates" / "openai-gpt-oss-120b.jinja"
THOUGHTS = "<|channel|>analysis<|message|>I'm\nthinking<|end|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>Hello, world!\nWhat's up?"
HELLO = "Hello, world!\nWhat's up?"
ARG1 = '{"arg1": 1}'
SPECIAL = [("special_function", {"arg1": 1})]
EDIT = (
    "<|channel|>analysis<|message|>Thinking about edit...<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.edit <|constrain|>json<|message|>"
    '{"oldString": "if (part < railCount - 1) {", "newString": "if (part < 4) {", "replaceAll": false}'
)
# (the test-chat.cpp case, tools, output, reasoning, content, calls)
CASES: list[tuple[str, list[Tool], str, str, str, list[tuple[str, Any]]]] = [
    ("final channel", [], "<|channel|>final<|message|>" + HELLO, "", HELLO, []),
    ("commentary channel", [], "<|channel|>commentary<|message|>" + HELLO, "", HELLO, []),
    ("analysis with final", [], THOUGHTS + FINAL, "I'm\nthinking", HELLO, []),
    ("analysis only (partial)", [], "<|channel|>analysis<|message|>I'm\nthinking",
     "I'm\nthinking", "", []),
    ("recipient in role header", [T.special_function_tool],
     " to=functions.special_function<|channel|>analysis<|message|>" + ARG1, "", "", SPECIAL),
    ("recipient in channel header", [T.special_function_tool],
     "<|channel|>analysis to=functions.special_function<|message|>" + ARG1, "", "", SPECIAL),
    ("with constraint", [T.special_function_tool],
     " to=functions.special_function<|channel|>analysis <|constrain|>json<|message|>" + ARG1,
     "", "", SPECIAL),
    ("commentary channel call", [T.special_function_tool],
     "<|channel|>commentary to=functions.special_function<|message|>" + ARG1, "", "", SPECIAL),
    ("reasoning then call", [T.special_function_tool],
     THOUGHTS + "<|start|>assistant to=functions.special_function<|channel|>analysis<|message|>"
     + ARG1, "I'm\nthinking", "", SPECIAL),
    ("complex tool calling", [T.edit_tool_oss], EDIT, "Thinking about edit...", "",
     [("edit", {"oldString": "if (part < railCount - 1) {", "newString": "if (part < 4) {",
                "replaceAll": False})]),
    ("builtin function, recipient in role", [],
     "<|channel|>analysis<|message|>I will execute python to say hello<|end|>"
     "<|start|>assistant to=container.exec<|channel|>commentary<|message|>python3 -c 'print(\"hello\")'",
     "I will execute python to say hello", "", []),
    ("builtin function, recipient in channel", [],
     "<|channel|>analysis<|message|>I will execute python to say hello<|end|>"
     "<|start|>assistant<|channel|>commentary to=python <|constrain|>code<|message|>print(\"hello\")",
     "I will execute python to say hello", "", []),
    ("commentary to=assistant before reasoning", [],
     "<|channel|>commentary to=assistant" + THOUGHTS + FINAL, "I'm\nthinking", HELLO, []),
    ("commentary to=assistant before final", [],
     THOUGHTS + "<|start|>assistant<|channel|>commentary to=assistant<|channel|>final<|message|>"
     + HELLO, "I'm\nthinking", HELLO, []),
]  # fmt: skip
IDS = [c[0] for c in CASES]


@pytest.mark.parametrize("step", [1, 5, 100_000])
@pytest.mark.parametrize(("case", "tools", "text", "reasoning", "content", "calls"), CASES, ids=IDS)
def test_parser_matches_llama_cpp(
    case: str, tools: list[Tool], text: str, reasoning: str, content: str, calls: list[Any],
    step: int,
) -> None:  # fmt: skip
    got = parse(HARMONY.parser(tools), text, step)
    assert got == {"content": content, "reasoning_content": reasoning, "tool_calls": calls}


def test_reasoning_format_none_keeps_the_analysis_message_in_content() -> None:
    # "Analysis channel ... with reasoning_format = none"
    got = parse(HARMONY.parser((), reasoning=False), THOUGHTS + FINAL, 1)
    assert got["content"] == THOUGHTS + HELLO and got["reasoning_content"] == ""


def test_a_call_cut_off_is_not_reported() -> None:
    text = "<|channel|>commentary to=functions.special_function<|message|>" + '{"arg1": '
    assert parse(HARMONY.parser([T.special_function_tool]), text, 1)["tool_calls"] == []


def test_output_that_is_not_harmony_is_content() -> None:
    got = parse(HARMONY.parser([T.special_function_tool]), "Just text <|end|> here", 1)
    assert got["content"] == "Just text <|end|> here"


CALLS = [(c[0], c[1], c[2]) for c in CASES if c[5]]


@pytest.mark.parametrize(("case", "tools", "text"), CALLS, ids=[c[0] for c in CALLS])
def test_required_grammar_accepts_the_reference_calls(
    case: str, tools: list[Tool], text: str
) -> None:
    spec = HARMONY.grammar(tools, ToolChoice("required"), parallel=True)
    # the grammar starts at the call's header (chat/harmony.py `_grammar`: why), so the
    # reference's analysis message before it is not part of a forced reply
    call = text[text.index("<|start|>assistant") + len("<|start|>assistant") :] if (
        "<|start|>" in text) else text  # fmt: skip
    assert not spec.lazy and accepts(spec.gbnf, call)


@pytest.mark.parametrize(("case", "tools", "text"), CALLS, ids=[c[0] for c in CALLS])
def test_auto_grammar_arms_at_the_recipient(case: str, tools: list[Tool], text: str) -> None:
    spec = HARMONY.grammar(tools, ToolChoice("auto"), parallel=True)
    assert spec.lazy
    # as engine/grammar.py's LazyTrigger: the whole output so far against each pattern,
    # the grammar starting at the first group
    for end in range(len(text) + 1):
        found = [m for p in spec.trigger_patterns if (m := re.fullmatch(p, text[:end]))]
        if found:
            assert accepts(spec.gbnf, text[found[0].start(1) :])
            return
    raise AssertionError("never triggered")


def test_auto_grammar_stays_off_for_an_answer() -> None:
    spec = HARMONY.grammar([T.special_function_tool], ToolChoice("auto"), parallel=True)
    text = THOUGHTS + FINAL + " to=functions is how I call"
    assert not any(re.fullmatch(p, text[:end]) for p in spec.trigger_patterns
                   for end in range(len(text) + 1))  # fmt: skip


@pytest.mark.parametrize(
    "text",
    [
        "<|channel|>commentary to=functions.other<|message|>" + ARG1,  # not offered
        "<|channel|>commentary to=functions.special_function<|message|>" + '{"arg1": "x"}',
        "<|channel|>commentary to=functions.special_function" + ARG1,  # no <|message|>
        "<|channel|>final<|message|>" + HELLO,  # required: an answer is not a call
        THOUGHTS + "<|channel|>commentary to=functions.special_function<|message|>" + ARG1,
        # a preamble or an analysis message before a forced call (llama.cpp admits them;
        # chat/harmony.py `_grammar`: why not here)
        "<|channel|>commentary<|message|>Let me look.<|end|><|start|>assistant"
        "<|channel|>commentary to=functions.special_function<|message|>" + ARG1,
        THOUGHTS + "<|start|>assistant<|channel|>commentary to=functions.special_function"
        "<|message|>" + ARG1,
    ],
)
def test_required_grammar_rejects_malformed_calls(text: str) -> None:
    spec = HARMONY.grammar([T.special_function_tool], ToolChoice("required"), parallel=True)
    assert not accepts(spec.gbnf, text)


def gpt_oss() -> ChatTemplate:
    return ChatTemplate(TEMPLATE.read_text(), bos_token="", eos_token="", add_bos=False)


def test_detection() -> None:
    assert detect_format(TEMPLATE.read_text()) is HARMONY


def test_plan_renders_past_calls_effort_and_parses_channels() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Run it"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {
                "name": "special_function", "arguments": ARG1}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]  # fmt: skip
    opts = ChatOptions(tools=(T.special_function_tool,), template_kwargs=effort_kwargs("high"))
    plan = plan_chat(gpt_oss(), messages, opts)
    text = plan.prompt.text
    assert "Reasoning: high" in text  # chat/reasoning.py's effort_kwargs, read by the template
    assert (
        "<|start|>assistant to=functions.special_function<|channel|>commentary json<|message|>"
        '{"arg1": 1}<|call|>'
    ) in text  # the arguments went to the template as a mapping (`|tojson` of it)
    assert text.endswith("<|start|>assistant")
    assert plan.grammar is not None and plan.grammar.lazy
    out = plan.parser()
    call = "<|start|>assistant<|channel|>commentary to=functions.special_function<|message|>"
    deltas = out.feed(THOUGHTS + call + ARG1) + out.finish()
    assert [d.kind for d in deltas] == ["reasoning", "start", "args"]
    assert deltas[1].text == "special_function" and json.loads(deltas[2].text) == {"arg1": 1}


def test_plan_without_tools_still_splits_the_channels() -> None:
    plan = plan_chat(gpt_oss(), [{"role": "user", "content": "Hi"}], ChatOptions())
    assert plan.grammar is None
    out = plan.parser()
    deltas = [d for ch in THOUGHTS + FINAL for d in out.feed(ch)] + out.finish()
    assert "".join(d.text for d in deltas if d.kind == "reasoning") == "I'm\nthinking"
    assert "".join(d.text for d in deltas if d.kind == "content") == HELLO
    none = plan_chat(gpt_oss(), [{"role": "user", "content": "Hi"}],
                     ChatOptions(reasoning_format="none")).parser()  # fmt: skip
    assert "".join(d.text for d in none.feed(THOUGHTS + FINAL) + none.finish()) == (
        THOUGHTS + HELLO
    )


def test_json_schema_with_tools_in_auto_mode() -> None:
    # "Structured output": the final message carries the document
    schema = {"type": "object", "properties": {"amount": {"type": "number"}}}
    spec = HARMONY.grammar([T.special_function_tool], ToolChoice("auto"), True, schema)
    assert not spec.lazy
    text = (
        "<|channel|>analysis<|message|>I need to output the invoice details in JSON<|end|>"
        '<|start|>assistant<|channel|>final <|constrain|>json<|message|>{"amount": 123.45}'
    )
    assert accepts(spec.gbnf, text)
    assert json.loads(parse(HARMONY.parser(), text, 3)["content"]) == {"amount": 123.45}
