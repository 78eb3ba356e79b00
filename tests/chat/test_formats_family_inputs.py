"""A custom tool's input grammar (chat/callformat.py `json_arguments` / `input_grammar`)
holds in the DeepSeek, Kimi, GLM and Command R7B call grammars too, and the call parses
back to its input."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chat.callformat import CallFormat
from chat.formats_cohere import COMMAND_R7B
from chat.formats_glm import GLM_45, GLM_47
from chat.formats_sections import DEEPSEEK_R1, DEEPSEEK_V3, KIMI_K2
from chat.tools import INPUT, InputGrammar, Tool, ToolChoice
from tests.chat.gbnf_check import accepts
from tests.chat.parse_run import parse

SCHEMA = {"type": "object", "properties": {INPUT: {"type": "string"}}, "required": [INPUT]}
TICKET = Tool("ticket", "", SCHEMA, InputGrammar("regex", r"[A-Z]{2,4}-\d+"))


def written(fmt: CallFormat, text: str) -> str:
    args = json.dumps({INPUT: text})
    if fmt is DEEPSEEK_V3:
        return f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>ticket<｜tool▁sep｜>{args}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    if fmt is DEEPSEEK_R1:
        return (f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>ticket\n```json\n"
                f"{args}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>")  # fmt: skip
    if fmt is KIMI_K2:
        return (f"<|tool_calls_section_begin|><|tool_call_begin|>functions.ticket:0"
                f"<|tool_call_argument_begin|>{args}<|tool_call_end|><|tool_calls_section_end|>")  # fmt: skip
    if fmt is GLM_45:
        return f"<tool_call>ticket\n<arg_key>{INPUT}</arg_key>\n<arg_value>{text}</arg_value>\n</tool_call>"
    if fmt is GLM_47:
        return (
            f"<tool_call>ticket<arg_key>{INPUT}</arg_key><arg_value>{text}</arg_value></tool_call>"
        )
    call = f'{{"tool_call_id": "0", "tool_name": "ticket", "parameters": {args}}}'
    return f"<|START_ACTION|>[{call}]<|END_ACTION|>"


FORMATS = [DEEPSEEK_V3, DEEPSEEK_R1, KIMI_K2, GLM_45, GLM_47, COMMAND_R7B]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_the_input_is_held_to_its_grammar(fmt: Any) -> None:
    spec = fmt.grammar([TICKET], ToolChoice("required"), parallel=False)
    assert accepts(spec.gbnf, written(fmt, "KV-42"))
    assert not accepts(spec.gbnf, written(fmt, "kv-42"))


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_the_call_parses_back_to_its_input(fmt: Any) -> None:
    got = parse(fmt.parser([TICKET], reasoning=False), written(fmt, "KV-42"), 3)
    assert got["tool_calls"] == [("ticket", {INPUT: "KV-42"})]
