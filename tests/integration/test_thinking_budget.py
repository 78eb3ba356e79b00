"""The thinking budget on the real default model: SmolLM2 served with a template that
opens `<think>` in the generation prompt (Qwen3.5's), so every token it writes is
thinking until the close is forced after N of them; then the answer follows."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.engine import Engine
from engine.thinking import ThinkingSpec
from engine.types import GenerateRequest, SamplingParams
from server.app import create_app
from server.config.tree import Settings
from tests.integration.test_engine import start

pytestmark = pytest.mark.model
TEMPLATE = (Path(__file__).parents[1] / "chat" / "templates" / "Qwen3.5-4B.jinja").read_text()
BUDGET = 8


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    e = await start(n_ctx=1024, n_seq_max=2, embeddings=False, exact_reuse=False)
    yield e
    e.close()


def ids(engine: Engine, text: str) -> tuple[int, ...]:
    return tuple(engine.tokenize(text, add_special=False, parse_special=True))


async def test_the_engine_forces_the_close_after_n_tokens(engine: Engine) -> None:
    prompt = ids(engine, "<|im_start|>user\nHow do I boil an egg?<|im_end|>\n"
                         "<|im_start|>assistant\n<think>\n")  # fmt: skip
    close = ids(engine, "</think>")
    spec = ThinkingSpec(ids(engine, "<think>"), close, inside=True, budget=BUDGET)
    request = GenerateRequest("t", prompt, SamplingParams(temperature=0.0), max_tokens=40,
                              thinking=spec)  # fmt: skip
    tokens: list[int] = []
    reasoning = 0
    async for _, out in await engine.generate([request]):
        tokens += out.token_ids
        reasoning = out.num_reasoning_tokens or reasoning
    assert close not in [tuple(tokens[i : i + len(close)]) for i in range(BUDGET)]
    assert tuple(tokens[BUDGET : BUDGET + len(close)]) == close
    assert len(tokens) > BUDGET + len(close)  # the answer followed
    assert reasoning == BUDGET + len(close)


@pytest.fixture
async def client(engine: Engine) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(Settings(), engine=engine)
    served = app.state.models.default
    served.template_override, served._template = TEMPLATE, None
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client


async def chat(client: httpx.AsyncClient, **extra: Any) -> dict[str, Any]:
    body = {"model": "smol", "messages": [{"role": "user", "content": "How do I boil an egg?"}],
            "temperature": 0, "max_tokens": 48, **extra}  # fmt: skip
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


async def test_chat_budget_reasoning_stops_and_the_answer_follows(
    engine: Engine, client: httpx.AsyncClient
) -> None:
    close = len(ids(engine, "</think>"))
    budgeted = await chat(client, thinking_budget_tokens=BUDGET)
    message = budgeted["choices"][0]["message"]
    assert message["reasoning_content"] and message["content"]  # thought, then answered
    assert budgeted["usage"]["completion_tokens_details"]["reasoning_tokens"] == BUDGET + close
    free = await chat(client)  # unlimited: the 135M model never closes by itself here
    assert free["usage"]["completion_tokens_details"]["reasoning_tokens"] > BUDGET + close
    thought = free["choices"][0]["message"]["reasoning_content"].lstrip()
    assert thought.startswith(message["reasoning_content"].strip())  # greedy: the same, cut
    none = await chat(client, thinking_budget_tokens=0)  # closed before anything is sampled
    assert none["usage"]["completion_tokens_details"]["reasoning_tokens"] == close
    assert not none["choices"][0]["message"].get("reasoning_content")
    assert none["choices"][0]["message"]["content"]
