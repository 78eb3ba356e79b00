"""Command R+'s `Action:` and fenced JSON list of `tool_name` / `parameters` actions,
against the case of llama.cpp's tests/test-chat.cpp (the command-r-plus block, which its
autoparser reads) and kvserve's own: the plan's parser fed whole and in pieces, the
grammars checked by llama.cpp's own grammar engine, past calls rendered through the
template. Not ported: the content case that wraps the answer in
`<|CHATBOT_TOKEN|>`..`<|END_OF_TURN_TOKEN|>` (the generation prompt writes the first and
kvserve stops at the second, an end-of-generation token), and the continuation case."""

from __future__ import annotations

from typing import Any

import pytest

from chat.formats_command_r import COMMAND_R_PLUS
from chat.plan import ChatOptions, plan_chat
from chat.tools import ToolChoice
from tests.chat import llama_tools as T
from tests.chat.llama_cases import (
    HELLO,
    SPECIAL,
    cases,
    detected,
    parser_test,
    past_calls,
    required_accepts,
    template,
)

CMD_R = "CohereForAI-c4ai-command-r-plus-tool_use.jinja"
TIME = '{"tool_name": "get_time", "parameters": {"city": "Paris"}}'
BOTH = [T.get_time_tool, T.magic_int_tool]


def action(*calls: str) -> str:
    return "Action:\n```json\n[" + ", ".join(calls) + "]\n```"


# (name, tools, output, reasoning, content, calls)
ROWS: list[tuple[Any, ...]] = [
    ("a call", [T.special_function_tool],
     action('{"tool_name": "special_function", "parameters": {"arg1": 1}}'), "", "", SPECIAL),
    # kvserve's own
    ("content", [T.special_function_tool], HELLO, "", HELLO, []),
    ("prose that names an action", BOTH, "Action: none needed.", "", "Action: none needed.", []),
    ("text and two calls, the template's layout", BOTH,
     'Sure.\nAction:\n```json\n[\n    {\n        "tool_name": "magic_int",\n        "parameters": '
     '{"ref": 1, "name": "]x"}\n    },\n    ' + TIME + "\n]```\nDone.", "", "Sure.\n\nDone.",
     [("magic_int", {"ref": 1, "name": "]x"}), ("get_time", {"city": "Paris"})]),
    ("an action list cut off", BOTH, 'Action:\n```json\n[{"tool_name": "get_time", "par', "", "",
     []),
]  # fmt: skip
CASES = cases(CMD_R, ROWS)


test_parser_matches_llama_cpp = parser_test(CASES, steps=(1, 5, 100_000))


@pytest.mark.parametrize("text", [
    action(TIME),
    action('{"tool_name": "magic_int", "parameters": {"ref": 1, "name": "x"}}', TIME),
    "Action:\n```json\n[" + TIME + "]```",  # the template's own close
])  # fmt: skip
def test_required_grammar_accepts_calls(text: str) -> None:
    assert required_accepts(COMMAND_R_PLUS, BOTH, text)


@pytest.mark.parametrize("text", [
    action('{"tool_name": "magic_int", "parameters": {"ref": "x", "name": "x"}}'),
    action('{"name": "get_time", "arguments": {"city": "Paris"}}'),  # other keys
    action('{"tool_name": "other", "parameters": {}}'),  # not offered
    HELLO + action(TIME),  # text before a forced call
])  # fmt: skip
def test_required_grammar_rejects_malformed_calls(text: str) -> None:
    assert not required_accepts(COMMAND_R_PLUS, BOTH, text)


def test_lazy_grammar_and_detection() -> None:
    spec = COMMAND_R_PLUS.grammar(BOTH, ToolChoice("auto"), parallel=False)
    assert spec.lazy and "Action:" in spec.trigger_patterns[0]
    assert detected(CMD_R) is COMMAND_R_PLUS
    assert detected("CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja") is not COMMAND_R_PLUS


def test_past_calls_render_through_the_template() -> None:
    """The template writes them indented; a turn with no text before its calls writes no
    "None" where its content is null."""
    messages = past_calls([("get_time", '{"city": "Paris"}', "sunny")])
    text = plan_chat(template(CMD_R), messages, ChatOptions(tools=tuple(BOTH))).prompt.text
    assert '<|CHATBOT_TOKEN|>\nAction:\n```json\n[\n    {\n        "tool_name": "get_time",' in text
    assert "<results>\nsunny</results>" in text
