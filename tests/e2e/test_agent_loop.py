"""A three-step agent loop through the openai SDK against the real server process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest

from tests.e2e.test_server_process import KEY, MODEL, server  # noqa: F401 - the fixture

pytestmark = pytest.mark.model

WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": WEATHER_PARAMS}},
    {"type": "function", "function": {"name": "get_time", "description": "Local time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                       "required": ["city"]}}},
]  # fmt: skip


@pytest.fixture
def sdk(server: str) -> Iterator[openai.OpenAI]:  # noqa: F811
    with openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0) as client:
        yield client


def test_three_step_agent_loop(sdk: openai.OpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "What is the weather and time in Oslo?"}]
    # 1: the model must call get_weather
    first = sdk.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, seed=1, max_tokens=60,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False,
    )  # fmt: skip
    assert first.choices[0].finish_reason == "tool_calls"
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMS)  # type: ignore[union-attr]
    messages += [first.choices[0].message.model_dump(exclude_none=True)]
    messages += [{"role": "tool", "tool_call_id": call.id, "content": '{"temp": 3}'}]
    # 2: another call, streamed and reassembled by the SDK's stream helper
    with sdk.chat.completions.stream(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice="required", seed=2,
        max_tokens=60, parallel_tool_calls=False,
    ) as stream:  # fmt: skip
        for _ in stream:
            pass
        second = stream.get_final_completion()
    again = sdk.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice="required", seed=2,
        max_tokens=60, parallel_tool_calls=False,
    )  # fmt: skip
    streamed = second.choices[0].message.tool_calls or []
    whole = again.choices[0].message.tool_calls or []
    assert [(c.function.name, c.function.arguments) for c in streamed] == [  # type: ignore[union-attr]
        (c.function.name, c.function.arguments)
        for c in whole  # type: ignore[union-attr]
    ]
    assert len(streamed) == 1 and streamed[0].id.startswith("call_")
    messages += [second.choices[0].message.model_dump(exclude_none=True, exclude={"parsed"})]
    messages += [{"role": "tool", "tool_call_id": streamed[0].id, "content": "09:30"}]
    # 3: the final answer, as text
    final = sdk.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice="none", seed=3, max_tokens=30
    )
    assert final.choices[0].message.tool_calls is None
    assert final.choices[0].message.content
    assert final.choices[0].finish_reason in ("stop", "length")
