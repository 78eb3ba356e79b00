"""Every chat template of llama.cpp's models/templates/ (copied to tests/chat/templates/
from the llama.cpp sources that the llama-cpp-python 0.3.36 sdist vendors) renders a
conversation with a system message, tools, a tool call and a tool result, through the
same path a chat request takes (chat.plan_chat). The assistant turn that calls the tool
has `content: null`, as the OpenAI SDK returns it and agent frameworks send it back (the
Messages API's tool_use-only turn and the Responses API's function_call item become the
same message); `content: ""` must render too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chat import ChatOptions, ChatTemplate, plan_chat
from chat.template import TemplateRefusal
from chat.tools import Tool

TEMPLATES = sorted((Path(__file__).parent / "templates").glob("*.jinja"))

# A parameter without a description (issue 10: Hermes-style templates read it).
TOOL = Tool(
    "get_weather",
    "Current weather of a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
CALL = {
    "id": "abcDEF123",  # 9 alphanumerics: Mistral templates refuse other ids
    "type": "function",
    "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})},
}


def conversation(call_content: str | None) -> list[dict]:
    return [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": call_content, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "abcDEF123", "content": "sunny, 21 C"},
        {"role": "assistant", "content": "It is sunny."},
        {"role": "user", "content": "And tomorrow?"},
    ]


def render(path: Path, messages: list[dict]) -> str:
    template = ChatTemplate(path.read_text(), bos_token="<s>", eos_token="</s>", add_bos=False)
    plan = plan_chat(template, messages, ChatOptions(tools=(TOOL,)))
    return plan.prompt.text


def test_the_fixtures_are_there() -> None:
    assert len(TEMPLATES) >= 60
    names = {p.name for p in TEMPLATES}
    assert "meta-llama-Llama-3.3-70B-Instruct.jinja" in names
    assert "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja" in names


@pytest.mark.parametrize("call_content", [None, ""], ids=["null", "empty"])
@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.stem)
def test_template_renders_tools_calls_results_and_system(
    path: Path, call_content: str | None
) -> None:
    messages = conversation(call_content)
    try:
        text = render(path, messages)
    except TemplateRefusal:
        # The template's own rule (e.g. "System role not supported"): a clean 400 for
        # the client. Without the system message it must render.
        text = render(path, messages[1:])
    else:
        assert "Answer briefly." in text
    for needle in ("Weather in Paris?", "get_weather", "Paris", "sunny, 21 C", "And tomorrow?"):
        assert needle in text, needle
    assert "None" not in text  # a null content is no text, not Python's name for it


def test_missing_attributes_render_empty() -> None:
    hermes = (
        Path(__file__).parent / "templates" / "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja"
    )
    bare = Tool("f", "", {"type": "object", "properties": {"x": {"type": "integer"}}})
    template = ChatTemplate(hermes.read_text(), bos_token="", eos_token="", add_bos=False)
    plan = plan_chat(template, [{"role": "user", "content": "hi"}], ChatOptions(tools=(bare,)))
    assert '"x"' in plan.prompt.text


def test_the_sandbox_still_holds() -> None:
    template = ChatTemplate(
        "{{ messages.__class__.__mro__ }}", bos_token="", eos_token="", add_bos=False
    )
    from chat.template import TemplateError

    with pytest.raises(TemplateError):
        template.render([{"role": "user", "content": "x"}])


def test_a_template_cannot_change_the_callers_messages() -> None:
    messages = [{"role": "user", "content": "x", "list": [1]}]
    template = ChatTemplate(
        "{% set _ = messages[0]['list'].append(2) %}{{ messages[0]['list'] }}",
        bos_token="", eos_token="", add_bos=False,
    )  # fmt: skip
    assert template.render(messages).text == "[1, 2]"
    assert messages[0]["list"] == [1]
