"""Custom tools (a free-text input held to a Lark or regex grammar, as Codex's `exec` and
`apply_patch`) in every call format's grammar: the tool-call grammar takes a valid call
and refuses an input that breaks the tool's grammar. Checked by llama.cpp's own grammar
engine (tests/chat/gbnf_check.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chat.callformat import CallFormat, tools_key
from chat.formats import GENERIC, HERMES, LLAMA3, MISTRAL
from chat.formats_xml import QWEN3_CODER
from chat.harmony import HARMONY
from chat.tools import INPUT, ChatInputError, InputGrammar, Tool, ToolChoice, check_tools
from tests.chat.gbnf_check import accepts
from tests.chat.parse_run import parse
from tests.chat.test_lark import APPLY_PATCH, EXEC, PATCH

SCHEMA = {"type": "object", "properties": {INPUT: {"type": "string"}}, "required": [INPUT],
          "additionalProperties": False}  # fmt: skip
APPLY = Tool("apply_patch", "Edit files.", SCHEMA, InputGrammar("lark", APPLY_PATCH))
EXEC_TOOL = Tool("exec", "Run JavaScript.", SCHEMA, InputGrammar("lark", EXEC))
TICKET = Tool("ticket", "", SCHEMA, InputGrammar("regex", r"[A-Z]{2,4}-\d+"))
TOOLS = [APPLY, EXEC_TOOL, TICKET]


def json_call(fmt: CallFormat, name: str, text: str) -> str:
    args = json.dumps({INPUT: text}, ensure_ascii=False)
    if fmt is HARMONY:
        return f" to=functions.{name}<|channel|>commentary <|constrain|>json<|message|>{args}"
    key = "parameters" if fmt is LLAMA3 else "arguments"
    call = f'{{"name": {json.dumps(name)}, "{key}": {args}}}'
    if fmt is HERMES:
        return f"<tool_call>\n{call}\n</tool_call>"
    if fmt is MISTRAL:
        return f"[TOOL_CALLS][{call}]"
    return f'{{"tool_calls": [{call}]}}' if fmt is GENERIC else call


def xml_call(fmt: CallFormat, name: str, text: str) -> str:
    return (f"<tool_call>\n<function={name}>\n<parameter={INPUT}>\n{text}\n</parameter>\n"
            "</function>\n</tool_call>")  # fmt: skip


FORMATS = [(f, json_call) for f in (HERMES, LLAMA3, MISTRAL, GENERIC, HARMONY)]
FORMATS.append((QWEN3_CODER, xml_call))
GOOD = [
    ("apply_patch", PATCH),
    ("apply_patch", PATCH.removesuffix("\n")),
    ("exec", "// @exec: {\"timeout\": 5}\nawait tools.exec_command({cmd: 'ls'})\n"),
    ("exec", 'const a = "\\\\";\r\n\tconsole.log(a)'),
    ("ticket", "KV-46"),
]
BAD = [
    ("apply_patch", PATCH.replace("*** End Patch\n", "")),  # no end
    ("apply_patch", PATCH.replace("+print", "print", 1)),  # an added line without its '+'
    ("apply_patch", "*** Begin Patch\n*** End Patch\n"),  # no hunk
    ("exec", ""),  # SOURCE: one character at least
    ("ticket", "kv-46"),
    ("ticket", "KV-"),
]


@pytest.mark.parametrize(("fmt", "call"), FORMATS, ids=[f.name for f, _ in FORMATS])
def test_tool_call_grammar_holds_the_input_to_its_grammar(fmt: CallFormat, call: Any) -> None:
    gbnf = fmt.grammar(TOOLS, ToolChoice("required"), parallel=False).gbnf
    for name, text in GOOD:
        assert accepts(gbnf, call(fmt, name, text)), (name, text)
    for name, text in BAD:
        assert not accepts(gbnf, call(fmt, name, text)), (name, text)
    # the input's grammar is the tool's: another tool's valid input is refused
    assert not accepts(gbnf, call(fmt, "ticket", PATCH))


@pytest.mark.parametrize(("fmt", "call"), FORMATS, ids=[f.name for f, _ in FORMATS])
def test_a_valid_call_parses_back_to_its_input(fmt: CallFormat, call: Any) -> None:
    parsed = parse(fmt.parser(TOOLS), call(fmt, "apply_patch", PATCH), step=7)
    assert parsed["tool_calls"] == [("apply_patch", {INPUT: PATCH})]


def test_named_choice_and_auto_mode() -> None:
    choice = ToolChoice("named", "exec")
    named = HERMES.grammar(check_tools(TOOLS, choice), choice, parallel=False)
    assert accepts(named.gbnf, json_call(HERMES, "exec", "1 + 1"))
    assert not accepts(named.gbnf, json_call(HERMES, "apply_patch", PATCH))
    auto = HERMES.grammar(TOOLS, ToolChoice("auto"), parallel=True)
    assert auto.lazy and not accepts(auto.gbnf, json_call(HERMES, "ticket", "kv"))


def test_the_grammar_is_part_of_the_memo_key() -> None:
    """The same tool without its grammar, or with another one, gets another grammar."""
    free = Tool(TICKET.name, "", SCHEMA)
    other = Tool(TICKET.name, "", SCHEMA, InputGrammar("regex", r"\d+"))
    assert len({tools_key([t]) for t in (TICKET, free, other)}) == 3
    grammars = [HERMES.grammar([t], ToolChoice("required"), False).gbnf for t in (TICKET, free, other)]
    text = json_call(HERMES, "ticket", "123")
    assert [accepts(g, text) for g in grammars] == [False, True, True]


def test_a_grammar_the_converter_cannot_take_names_the_format() -> None:
    bad = Tool("bad", "", SCHEMA, InputGrammar("lark", "start: a\na: a \"x\" | \"y\""))
    with pytest.raises(ChatInputError) as caught:
        HERMES.grammar([TICKET, bad], ToolChoice("required"), False)
    assert caught.value.param == "tools[1].format.definition"
