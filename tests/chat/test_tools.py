"""Tool-call formats: parsers fed whole and one character at a time, grammars, rendering."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chat.formats import GENERIC, HERMES, LLAMA3, MISTRAL, ToolFormat, detect_format
from chat.plan import ChatOptions, plan_chat
from chat.reasoning import ReasoningSplitter
from chat.template import ChatTemplate
from chat.tools import ChatInputError, Tool, ToolChoice
from tests.chat.parse_run import deltas, raw_calls
from tests.chat.test_template import SMOL

HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:\n{% for t in tools %}{{ t.function | tojson }}\n"
    "{% endfor %}Call as <tool_call>{...}</tool_call><|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n"
    "{% for c in m.tool_calls %}<tool_call>\n{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WEATHER = Tool(
    "get_weather",
    "Weather",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
TIME = Tool("get_time", "", {"type": "object", "properties": {}})


def run(fmt: ToolFormat, text: str, step: int) -> tuple[str, list[tuple[str, str]]]:
    """The content and each call's raw arguments text, from the format's own parser."""
    released = deltas(fmt.parser(), text, step)
    return "".join(d.text for d in released if d.kind == "content"), raw_calls(released)


CASES = [
    (HERMES, 'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa<ris>"}}\n</tool_call>', "Sure.",
     [("get_weather", {"city": "Pa<ris>"})]),
    (HERMES, '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b", "arguments": {"x": [1, "}"]}}</tool_call>', "",
     [("a", {}), ("b", {"x": [1, "}"]})]),
    (HERMES, "no <tool call here> < tool_call", "no <tool call here> < tool_call", []),
    (GENERIC, ' {"tool_calls": [{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Oslo"}}]}', "",
     [("get_time", {}), ("get_weather", {"city": "Oslo"})]),
    (GENERIC, '{"answer": 42}', '{"answer": 42}', []),
    (GENERIC, "Plain text {\"tool_calls\": []}", "Plain text {\"tool_calls\": []}", []),
    (LLAMA3, '{"name": "get_weather", "parameters": {"city": "Rome"}}', "", [("get_weather", {"city": "Rome"})]),
    (LLAMA3, "The weather is fine.", "The weather is fine.", []),
    (MISTRAL, 'Ok[TOOL_CALLS][{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Lima"}}]', "Ok",
     [("get_time", {}), ("get_weather", {"city": "Lima"})]),
]  # fmt: skip


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), CASES)
@pytest.mark.parametrize("step", [1, 3, 10_000])
def test_parsers_streamed_and_whole(
    fmt: ToolFormat, text: str, content: str, calls: list[tuple[str, Any]], step: int
) -> None:
    got_content, got_calls = run(fmt, text, step)
    assert got_content == content
    assert [(n, json.loads(a)) for n, a in got_calls] == calls


def test_truncated_call_reports_name_and_partial_arguments() -> None:
    content, calls = run(HERMES, '<tool_call>{"name": "get_weather", "arguments": {"ci', 1)
    assert content == "" and calls == [("get_weather", '{"ci')]


def test_reasoning_split_streamed_and_whole() -> None:
    text = "<think>step 1\nstep 2</think>\n\nAnswer <b>bold</b>"
    for step in (1, 2, 1000):
        released = deltas(ReasoningSplitter(), text, step)
        assert "".join(d.text for d in released if d.kind == "reasoning") == "step 1\nstep 2"
        assert "".join(d.text for d in released if d.kind == "content") == "Answer <b>bold</b>"
    inside = ReasoningSplitter(inside=True)
    assert [d.kind for d in inside.feed("hmm</think>ok") + inside.finish()] == [
        "reasoning",
        "content",
    ]


def test_format_detection() -> None:
    assert detect_format(SMOL) is GENERIC
    assert detect_format(HERMES_TEMPLATE) is HERMES
    assert detect_format("{{ '[TOOL_CALLS]' }}") is MISTRAL
    assert detect_format("{{ '<|python_tag|>' }}") is LLAMA3


def template(source: str) -> ChatTemplate:
    return ChatTemplate(source, bos_token="", eos_token="<|im_end|>", add_bos=False)


def plan(source: str, choice: ToolChoice, **kw: Any) -> Any:
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    opts = ChatOptions(tools=(WEATHER, TIME), tool_choice=choice, **kw)
    return plan_chat(template(source), messages, opts)


def test_grammar_per_tool_choice_generic() -> None:
    auto = plan(SMOL, ToolChoice("auto"))
    assert auto.grammar.lazy and auto.grammar.trigger_patterns
    required = plan(SMOL, ToolChoice("required"))
    assert not required.grammar.lazy and "get_time" in required.grammar.gbnf
    named = plan(SMOL, ToolChoice("named", "get_weather"))
    assert "get_time" not in named.grammar.gbnf
    none = plan(SMOL, ToolChoice("none"))
    assert none.grammar is None and none.tool_format is None
    assert "get_weather" not in none.prompt.text
    assert "You can call these tools" in required.prompt.text
    assert required.prompt.text.startswith("<|im_start|>system\nYou can call")


def test_none_keeps_a_native_template_s_tools_in_the_prompt_and_constrains_nothing() -> None:
    """As llama.cpp renders them: the prompt's head is the one an `auto` turn has."""
    none = plan(HERMES_TEMPLATE, ToolChoice("none"))
    auto = plan(HERMES_TEMPLATE, ToolChoice("auto"))
    assert none.grammar is None and none.tool_format is None
    assert '"name": "get_weather"' in none.prompt.text
    assert none.prompt.text == auto.prompt.text


def test_hermes_template_renders_tools_and_history() -> None:
    p = plan(HERMES_TEMPLATE, ToolChoice("auto"))
    assert '"name": "get_weather"' in p.prompt.text and "You can call" not in p.prompt.text
    assert p.grammar.trigger_patterns == (r"[\s\S]*?(<tool_call>)[\s\S]*",)
    assert p.grammar.gbnf.startswith('root ::= "<tool_call>"')
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "cold"},
    ]  # fmt: skip
    out = plan_chat(template(HERMES_TEMPLATE), messages, ChatOptions(tools=(WEATHER,)))
    # tojson keeps key order (as transformers); the arguments went to the template as an object, not a string
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
        in out.prompt.text
    )
    assert "<tool_response>\ncold\n</tool_response>" in out.prompt.text


def test_generic_history_merges_tool_results_into_one_user_turn() -> None:
    messages = [
        {"role": "user", "content": "Both?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
            {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "X"}'}}]},
        {"role": "tool", "tool_call_id": "a", "content": "noon"},
        {"role": "tool", "tool_call_id": "b", "content": "rain"},
    ]  # fmt: skip
    text = plan_chat(template(SMOL), messages, ChatOptions()).prompt.text
    assert text.count("<|im_start|>user") == 2
    assert (
        '{"tool_response": {"name": "get_time", "content": "noon"}}\n{"tool_response": {"name": "get_weather"'
        in text
    )


@pytest.mark.parametrize(
    ("tools", "choice", "param"),
    [
        ((), ToolChoice("required"), "tool_choice"),
        ((WEATHER,), ToolChoice("named", "nope"), "tool_choice"),
        ((WEATHER, WEATHER), ToolChoice("auto"), "tools[1].function.name"),
        ((Tool("f", "", {"type": 5}),), ToolChoice("auto"), "tools[0].function.parameters"),
        ((Tool("f", "", {"type": "object", "$ref": "https://x.org/s"}),), ToolChoice("auto"), "tools[0].function.parameters"),
    ],
)  # fmt: skip
def test_bad_tools_name_the_field(tools: tuple[Tool, ...], choice: ToolChoice, param: str) -> None:
    with pytest.raises(ChatInputError) as info:
        plan_chat(
            template(SMOL),
            [{"role": "user", "content": "x"}],
            ChatOptions(tools=tools, tool_choice=choice),
        )
    assert info.value.param == param
