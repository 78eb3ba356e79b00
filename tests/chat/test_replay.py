"""chat/replay.py: a past tool turn renders as the text the model sampled, where the
template's framing keeps the prompt it was sampled after; else as the template writes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chat.plan import ChatOptions, plan_chat
from chat.replay import SampledTurn, prompt_digest
from chat.template import ChatTemplate
from chat.tools import Tool

TEMPLATES = Path(__file__).parent / "templates"
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
OPTIONS = ChatOptions(tools=(Tool("get_weather", "Weather in a city", SCHEMA),))
USER = {"role": "user", "content": "Weather in Paris?"}

# What each model samples for the call, in its own syntax (spaced and ordered unlike the
# template's rendering of the parsed call, where the syntax has JSON).
SAMPLED = {
    "Qwen-Qwen2.5-7B-Instruct": '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}'
    "\n</tool_call>",
    "meta-llama-Llama-3.3-70B-Instruct": '{"name":"get_weather","parameters":{"city":"Paris"}}',
    "Mistral-Small-3.2-24B-Instruct-2506": '[TOOL_CALLS]get_weather[ARGS]{"city":"Paris"}',
    # (a parameter written on one line, where the template writes it between newlines)
    "Qwen3-Coder": "<tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n"
    "</function>\n</tool_call>",
    # A thinking template: the generation prompt opens <think>, a past turn is framed
    # as <think>\n\n</think>\n\n (the header is read back as the generation's).
    "Qwen3.5-4B": "Paris it is.\n</think>\n\n<tool_call>\n<function=get_weather>\n"
    "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
    # gpt-oss writes a past call in the commentary channel (the recipient in the role
    # header), content in the final one: chat/harmony.py adapts the replayed turn
    "openai-gpt-oss-120b": "<|channel|>analysis<|message|>Paris.<|end|><|start|>assistant"
    '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}',
}
# Mistral's templates count an assistant turn without calls in their user/assistant
# alternation and refuse two of them between tool results: from the second tool turn
# after a user turn on, the template renders the calls (as before replay existed).
REFUSE_TWO = {"Mistral-Small-3.2-24B-Instruct-2506"}


def template(name: str) -> ChatTemplate:
    source = (TEMPLATES / f"{name}.jinja").read_text()
    return ChatTemplate(source, bos_token="<s>", eos_token="</s>", add_bos=False)


def call_turn(call_id: str, city: str = "Paris") -> dict[str, Any]:
    call = {"id": call_id, "type": "function",
            "function": {"name": "get_weather", "arguments": f'{{"city": "{city}"}}'}}  # fmt: skip
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def result(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "sunny"}


class Memory:
    """A lookup by the first call's id, as server/serving/replay.py keys its turns."""

    def __init__(self) -> None:
        self.turns: dict[str, SampledTurn] = {}
        self.asked = 0

    def remember(self, call_id: str, prompt: str, text: str) -> None:
        self.turns[call_id] = SampledTurn(text, prompt_digest(prompt))

    def __call__(self, message: Any) -> list[SampledTurn]:
        self.asked += 1
        found = self.turns.get(message["tool_calls"][0]["id"])
        return [found] if found else []


@pytest.mark.parametrize("name", sorted(SAMPLED))
def test_two_tool_turns_keep_the_sampled_text(name: str) -> None:
    """Turn 2 starts with turn 1's prompt and its sampled call, turn 3 with turn 2's
    prompt and its call: the prompt the engine held, prompt + sampled text, each time."""
    tpl, memory, sampled = template(name), Memory(), SAMPLED[name]
    first = plan_chat(tpl, [USER], OPTIONS, memory).prompt.text
    memory.remember("abcDEF123", first, sampled)
    history = [USER, call_turn("abcDEF123"), result("abcDEF123")]
    second = plan_chat(tpl, history, OPTIONS, memory).prompt.text
    assert second.startswith(first + sampled)
    plain = plan_chat(tpl, history, OPTIONS).prompt.text
    assert plain != second and sampled not in plain  # what was lost before
    memory.remember("ghiJKL456", second, sampled)
    history += [call_turn("ghiJKL456"), result("ghiJKL456")]
    third = plan_chat(tpl, history, OPTIONS, memory).prompt.text
    if name in REFUSE_TWO:
        assert third == plan_chat(tpl, history, OPTIONS).prompt.text
    else:
        assert third.startswith(second + sampled)


@pytest.mark.parametrize("name", sorted(SAMPLED))
def test_a_turn_after_another_prompt_renders_from_the_template(name: str) -> None:
    """The turn was sampled after another prompt (here: other tools): the text before it
    is not that prompt, so the template renders it."""
    tpl, memory = template(name), Memory()
    other = ChatOptions(tools=(Tool("get_time", "The time", {"type": "object"}),))
    memory.remember("abcDEF123", plan_chat(tpl, [USER], other).prompt.text, SAMPLED[name])
    history = [USER, call_turn("abcDEF123"), result("abcDEF123")]
    replayed = plan_chat(tpl, history, OPTIONS, memory).prompt.text
    assert replayed == plan_chat(tpl, history, OPTIONS).prompt.text


def test_a_failed_turn_renders_it_and_later_ones_from_the_template() -> None:
    """Turn 1 sampled after a prompt that is not the one now before it: turn 1 and turn 2
    (whose prompt held turn 1 as replayed) render from the template, the rest stays."""
    tpl, memory = template("Qwen-Qwen2.5-7B-Instruct"), Memory()
    sampled = SAMPLED["Qwen-Qwen2.5-7B-Instruct"]
    memory.remember("abcDEF123", "some other prompt", sampled)
    history = [USER, call_turn("abcDEF123"), result("abcDEF123")]
    memory.remember("ghiJKL456", plan_chat(tpl, history, OPTIONS).prompt.text + "x", sampled)
    history += [call_turn("ghiJKL456"), result("ghiJKL456")]
    assert (
        plan_chat(tpl, history, OPTIONS, memory).prompt.text
        == plan_chat(tpl, history, OPTIONS).prompt.text
    )
