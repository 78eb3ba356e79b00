"""The Responses and Messages APIs through the real clients (openai, anthropic,
openai-agents) against the real server process and model."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import anthropic
import jsonschema
import openai
import pytest

from tests.e2e.shared import keyed_server, run_agent

pytestmark = pytest.mark.model

MODEL = "SmolLM2-135M-Instruct"
KEY = "sk-e2e-agent-apis"
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
}
CITY = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 20}},
        "required": ["capital"], "additionalProperties": False}  # fmt: skip
# A long, fixed head: prompts over the cache's 64-token minimum are reused across requests.
SYSTEM = "You are a concise geography assistant. " * 12


server = keyed_server(KEY)


@pytest.fixture
def oai(server: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0) as client:
        yield client


@pytest.fixture
def claude(server: str) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=server, api_key=KEY, max_retries=0) as client:
        yield client


# -- openai: Responses -------------------------------------------------------------------


def test_responses_plain_and_streamed(oai: openai.OpenAI) -> None:
    args: dict[str, Any] = dict(model=MODEL, input="What is the capital of France?",
                                temperature=0, max_output_tokens=24, store=False)  # fmt: skip
    plain = oai.responses.create(**args)
    assert plain.status in ("completed", "incomplete") and plain.output_text
    assert plain.usage is not None and plain.usage.input_tokens > 10
    with oai.responses.stream(**args) as stream:
        events = list(stream)
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    last = events[-1]
    assert last.type == f"response.{plain.status}"  # the helper's final needs 'completed'
    assert deltas == last.response.output_text == plain.output_text  # type: ignore[union-attr]
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_responses_required_tool(oai: openai.OpenAI) -> None:
    response = oai.responses.create(
        model=MODEL, input="What is the weather in Oslo?", max_output_tokens=60, store=False,
        tools=[{"type": "function", "name": "get_weather", "description": "Weather in a city",
                "parameters": WEATHER, "strict": True}],
        tool_choice="required", parallel_tool_calls=False,
    )  # fmt: skip
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)


def test_responses_json_schema(oai: openai.OpenAI) -> None:
    response = oai.responses.create(
        model=MODEL, input="What is the capital of France? Answer in JSON.", store=False,
        max_output_tokens=60, temperature=0,
        text={"format": {"type": "json_schema", "name": "capital", "schema": CITY,
                         "strict": True}},
    )  # fmt: skip
    jsonschema.validate(json.loads(response.output_text), CITY)


def test_responses_three_turns_reuse_the_conversation(oai: openai.OpenAI) -> None:
    questions = ["What is the capital of France?", "And of Italy?", "And of Spain?"]
    previous, cached, history = None, [], []
    for question in questions:
        response = oai.responses.create(
            model=MODEL, instructions=SYSTEM, input=question, previous_response_id=previous,
            temperature=0, max_output_tokens=16,
        )  # fmt: skip
        assert response.usage is not None and response.usage.input_tokens_details is not None
        cached.append(response.usage.input_tokens_details.cached_tokens)
        history += [{"role": "user", "content": question},
                    {"role": "assistant", "content": response.output_text}]  # fmt: skip
        previous = response.id
    assert cached[1] > cached[0] and cached[2] > cached[1], cached
    whole = oai.responses.create(
        model=MODEL, instructions=SYSTEM, input=history[:-1], temperature=0,
        max_output_tokens=16, store=False,
    )  # fmt: skip
    assert whole.output_text == history[-1]["content"]
    assert oai.responses.retrieve(previous).id == previous  # type: ignore[arg-type]
    oai.responses.delete(previous)  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(previous)  # type: ignore[arg-type]


# -- anthropic: Messages -------------------------------------------------------------------


def test_messages_plain_and_streamed(claude: anthropic.Anthropic) -> None:
    # This anthropic SDK no longer sends sampling fields; kvserve still takes them.
    args: dict[str, Any] = dict(model=MODEL, max_tokens=24, extra_body={"temperature": 0},
                                messages=[{"role": "user", "content": "Name a large city."}])  # fmt: skip
    plain = claude.messages.create(**args)
    assert plain.content[0].type == "text" and plain.content[0].text
    assert plain.stop_reason in ("end_turn", "max_tokens")
    with claude.messages.stream(**args) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == plain.content[0].text == final.content[0].text  # type: ignore[union-attr]


def test_messages_tool_any_and_result_round_trip(claude: anthropic.Anthropic) -> None:
    tools: Any = [{"name": "get_weather", "description": "Weather in a city",
                   "input_schema": WEATHER}]  # fmt: skip
    messages: Any = [{"role": "user", "content": "What is the weather in Oslo?"}]
    first = claude.messages.create(model=MODEL, max_tokens=60, tools=tools, messages=messages,
                                   tool_choice={"type": "any",
                                                "disable_parallel_tool_use": True})  # fmt: skip
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use" and use.name == "get_weather"
    jsonschema.validate(use.input, WEATHER)
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                      "content": "Sunny, 21 C"}]},
    ]  # fmt: skip
    # Room for a whole answer or call: a call cut by max_tokens is not returned, which
    # would leave the content empty (tests/server/api/test_truncated_calls.py).
    second = claude.messages.create(model=MODEL, max_tokens=120, tools=tools, messages=messages,
                                    extra_body={"temperature": 0})  # fmt: skip
    assert second.content and second.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_messages_count_tokens_and_cache_read(claude: anthropic.Anthropic) -> None:
    system = f"Session {uuid.uuid4().hex}. {SYSTEM}"  # a head nobody has sent before
    messages: Any = [{"role": "user", "content": "What is the capital of France?"}]
    counted = claude.messages.count_tokens(model=MODEL, system=system, messages=messages)
    first = claude.messages.create(model=MODEL, system=system, messages=messages, max_tokens=16,
                                   extra_body={"temperature": 0})  # fmt: skip
    # Anthropic's accounting: input_tokens are the ones prefilled, cache reads come on top
    # (a slot's leftover KV may share the template's first few tokens).
    usage = first.usage
    assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)
    assert (usage.cache_read_input_tokens or 0) < 8
    messages += [{"role": "assistant", "content": first.content[0].text},  # type: ignore[union-attr]
                 {"role": "user", "content": "And of Italy?"}]  # fmt: skip
    second = claude.messages.create(model=MODEL, system=system, messages=messages, max_tokens=16,
                                    extra_body={"temperature": 0})  # fmt: skip
    assert (second.usage.cache_read_input_tokens or 0) > 0


# -- openai-agents ---------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
def test_agents_runner_calls_the_tool(server: str, api: str) -> None:

    from agents import Agent, ModelSettings, function_tool, set_tracing_disabled
    from agents.items import ToolCallItem, ToolCallOutputItem
    from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
    from agents.models.openai_responses import OpenAIResponsesModel

    set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0)
    seen: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        seen.append(city)
        return f"Sunny, 21 C in {city}"

    model: Any = (OpenAIResponsesModel(MODEL, client) if api == "responses"
                  else OpenAIChatCompletionsModel(MODEL, client))  # fmt: skip
    agent = Agent(name="weather", instructions="Answer weather questions.", tools=[get_weather],
                  model=model, model_settings=ModelSettings(tool_choice="required", temperature=0,
                                                            max_tokens=400,
                                                            # one call a turn: greedy, this
                                                            # model repeats calls until the
                                                            # token limit when it may
                                                            parallel_tool_calls=False))  # fmt: skip
    result = run_agent(agent, client, "What is the weather in Oslo?")
    assert seen, "the tool was not called"
    assert any(isinstance(i, ToolCallItem) for i in result.new_items)
    assert any(isinstance(i, ToolCallOutputItem) for i in result.new_items)
    assert isinstance(result.final_output, str) and result.final_output
