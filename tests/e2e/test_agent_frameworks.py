"""Agent frameworks that send tools together with a structured output type, against the
real server process: every tool call and every final document they get validates.
And a tool whose parameters Pydantic generated from a tuple, a set and a discriminated
union is accepted in auto, required and named mode."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any, Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.e2e.shared import keyed_server, run_agent

pytestmark = pytest.mark.model

MODEL = "SmolLM2-135M-Instruct"
KEY = "sk-e2e-frameworks"


class Capital(BaseModel):
    country: str = Field(max_length=20)
    capital: str = Field(max_length=20)


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int = Field(ge=0, le=9)


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool


class PetArgs(BaseModel):
    point: tuple[float, float]
    tags: set[Annotated[str, Field(max_length=8)]] = Field(max_length=3)
    pet: Annotated[Cat | Dog, Field(discriminator="kind")]


PET_SCHEMA = PetArgs.model_json_schema()
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
           "required": ["city"]}  # fmt: skip


server = keyed_server(KEY)


def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"Sunny, 21 C in {city}"


@pytest.mark.parametrize(
    "choice", ["auto", "required", {"type": "function", "function": {"name": "register_pet"}}]
)
def test_pydantic_tool_schema_in_every_mode(server: str, choice: Any) -> None:
    # Grammar-constrained decoding of a long schema on a loaded 2-core machine is slow.
    tools: Any = [{"type": "function", "function": {"name": "register_pet",
                   "description": "Register a pet", "parameters": PET_SCHEMA}}]  # fmt: skip
    with openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=1800) as client:
        reply = client.chat.completions.create(
            model=MODEL, tools=tools, tool_choice=choice, max_tokens=120, seed=3,
            messages=[{"role": "user", "content": "Register my dog Rex, a good boy, at 1.5, 2."}],
        )  # fmt: skip
    for call in reply.choices[0].message.tool_calls or []:
        PetArgs.model_validate_json(call.function.arguments)  # type: ignore[union-attr]
    if choice != "auto":
        assert reply.choices[0].message.tool_calls


def test_openai_agents_tool_and_output_type(server: str) -> None:
    from agents import Agent, ModelSettings, function_tool, set_tracing_disabled
    from agents.models.openai_responses import OpenAIResponsesModel

    set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0)
    agent = Agent(name="geo", instructions="Answer with the capital.",
                  tools=[function_tool(get_weather)], output_type=Capital,
                  model=OpenAIResponsesModel(MODEL, client),
                  model_settings=ModelSettings(temperature=0, max_tokens=400))  # fmt: skip
    result = run_agent(agent, client, "What is the capital of France?")
    assert isinstance(result.final_output, Capital)


def test_langchain_bind_tools_with_response_format(server: str) -> None:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=MODEL, base_url=f"{server}/v1", api_key=KEY, max_tokens=120,
                     max_retries=0, temperature=0)  # type: ignore[call-arg]  # fmt: skip
    bound = llm.bind_tools([get_weather], response_format=Capital, strict=True)
    message = bound.invoke("What is the capital of France?")
    for call in message.tool_calls:  # type: ignore[attr-defined]
        assert call["name"] == "get_weather"
        jsonschema.validate(call["args"], WEATHER)
    if not message.tool_calls:  # type: ignore[attr-defined]
        Capital.model_validate(json.loads(message.content))  # type: ignore[arg-type]


def test_pydantic_ai_native_output_with_a_tool(server: str) -> None:
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    # Our client, closed in our loop: run_sync would run on an event loop pydantic-ai makes
    # and never closes, and a provider that makes its own client closes it only when the
    # agent is used as an async context manager (both leak a socket).
    async def run() -> Any:
        async with openai.AsyncOpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0) as client:
            model = OpenAIChatModel(MODEL, provider=OpenAIProvider(openai_client=client))
            agent = Agent(model, tools=[get_weather], output_type=NativeOutput(Capital),
                          model_settings={"max_tokens": 400, "temperature": 0})  # fmt: skip
            return await agent.run("What is the capital of France?")

    result = asyncio.run(run())
    assert isinstance(result.output, Capital)
