"""Each API's thinking fields -> the engine's ThinkingSpec (server/serving/thinking.py),
and the reasoning tokens in the usage, against the fake engine (tokens are bytes)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from chat.reasoning import thinking_syntax
from engine.thinking import ThinkingSpec
from server.api.chat.protocol import request_budget
from server.app import create_app
from server.config.tree import ModelSection, Settings
from server.serving.thinking import thinking_spec
from tests.fakes import FakeEngine
from tests.server.api.test_openai_api import MODEL

TEMPLATES = Path(__file__).parents[2] / "chat" / "templates"
QWEN35 = TEMPLATES / "Qwen3.5-4B.jinja"  # opens <think> in the generation prompt
THINKING, ANSWER = "Let me see.", "Sunny."
USER = [{"role": "user", "content": "Weather?"}]


def tag(text: str) -> tuple[int, ...]:
    return tuple(text.encode())  # the fake's tokenizer: one token per byte


@pytest.fixture
def fake() -> FakeEngine:
    engine = FakeEngine(n_ctx=16384)
    engine.reply = f"{THINKING}\n</think>\n\n{ANSWER}".encode()
    return engine


async def client_for(fake: FakeEngine, template: Path | None) -> httpx.AsyncClient:
    model = ModelSection(id=MODEL, chat_template=str(template) if template else "")
    app = create_app(Settings(models=(model,)), engine=fake)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


@pytest.fixture
async def client(fake: FakeEngine) -> AsyncIterator[httpx.AsyncClient]:
    async with await client_for(fake, QWEN35) as client:
        yield client


def test_the_spec_of_each_thinking_syntax() -> None:
    fake = FakeEngine()
    source = QWEN35.read_text()
    spec = thinking_spec(fake, source, "<|im_start|>assistant\n<think>\n", 5, {})
    assert spec == ThinkingSpec(tag("<think>"), tag("</think>"), True, 5)
    off = thinking_spec(fake, source, "assistant\n", None, {"enable_thinking": False})
    assert off is not None and off.budget == 0 and not off.inside  # thinking off: 0
    assert thinking_spec(fake, source, "x", None, {})  == ThinkingSpec(
        tag("<think>"), tag("</think>"), False, None)  # fmt: skip
    harmony = thinking_syntax((TEMPLATES / "openai-gpt-oss-120b.jinja").read_text())
    assert harmony is not None and harmony.close == "<|end|>"
    cohere = (TEMPLATES / "Cohere2MoE.jinja").read_text()
    spec = thinking_spec(fake, cohere, "<|CHATBOT_TOKEN|><|START_THINKING|>", None, {})
    assert spec is not None and spec.inside and spec.close == tag("<|END_THINKING|>")


def test_no_thinking_block_no_spec_and_a_budget_is_a_logged_no_op(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="kvserve.server"):
        assert thinking_spec(FakeEngine(), "{{ messages }}", "", 64, {}) is None
    assert "no-op" in caplog.text
    assert request_budget(None, 7) == 7 and request_budget(3, 7) == 3
    assert request_budget(-1, 7) is None  # llama-server's: -1 is the server's default


async def test_chat_budget_fields_and_reasoning_tokens(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    r = await client.post("/v1/chat/completions", json={
        "model": MODEL, "messages": USER, "thinking_budget_tokens": 12})  # fmt: skip
    assert r.status_code == 200, r.text
    assert fake.submitted[-1].thinking == ThinkingSpec(tag("<think>"), tag("</think>"), True, 12)
    body = r.json()
    assert body["choices"][0]["message"]["reasoning_content"].strip() == THINKING
    assert body["choices"][0]["message"]["content"] == ANSWER
    # the thinking and the close, as generated (the opening was in the prompt)
    reasoning = len(f"{THINKING}\n</think>".encode())
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": reasoning}
    r = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": USER,
        "reasoning_budget_tokens": 3, "thinking_budget_tokens": 9})  # fmt: skip
    assert fake.submitted[-1].thinking is not None and fake.submitted[-1].thinking.budget == 3
    await client.post("/v1/chat/completions", json={"model": MODEL, "messages": USER,
                                                    "thinking_budget_tokens": -1})  # fmt: skip
    assert fake.submitted[-1].thinking is not None and fake.submitted[-1].thinking.budget is None


async def test_chat_budget_out_of_range_is_a_400_naming_it(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", json={
        "model": MODEL, "messages": USER, "reasoning_budget_tokens": -2})  # fmt: skip
    assert r.status_code == 400
    assert "reasoning_budget_tokens" in r.text


async def test_a_template_without_thinking_takes_the_fields_as_no_ops(fake: FakeEngine) -> None:
    fake.reply = ANSWER.encode()
    async with await client_for(fake, None) as client:  # the fake's ChatML: no thinking
        r = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": USER,
            "thinking_budget_tokens": 5, "reasoning_effort": "high"})  # fmt: skip
        assert r.status_code == 200, r.text
        assert fake.submitted[-1].thinking is None
        assert r.json()["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}
        r = await client.post("/v1/messages", headers={"anthropic-version": "2023-06-01"},
                              json={"model": MODEL, "max_tokens": 64, "messages": USER,
                                    "thinking": {"type": "enabled", "budget_tokens": 32}})  # fmt: skip
        assert r.status_code == 200, r.text


async def test_messages_thinking(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    async def send(thinking: dict[str, Any]) -> ThinkingSpec | None:
        r = await client.post("/v1/messages", headers={"anthropic-version": "2023-06-01"},
                              json={"model": MODEL, "max_tokens": 64, "messages": USER,
                                    "thinking": thinking})  # fmt: skip
        assert r.status_code == 200, r.text
        return fake.submitted[-1].thinking

    enabled = await send({"type": "enabled", "budget_tokens": 32})
    assert enabled is not None and enabled.budget == 32 and enabled.inside
    disabled = await send({"type": "disabled"})  # the template's switch off, and budget 0
    assert disabled is not None and disabled.budget == 0
    adaptive = await send({"type": "adaptive"})
    assert adaptive is not None and adaptive.budget is None


async def test_responses_usage_counts_the_engines_reasoning_tokens(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    r = await client.post("/v1/responses", json={"model": MODEL, "input": "Weather?",
                                                 "reasoning": {"effort": "low"}})  # fmt: skip
    assert r.status_code == 200, r.text
    details = r.json()["usage"]["output_tokens_details"]
    assert details == {"reasoning_tokens": len(f"{THINKING}\n</think>".encode())}
    assert fake.submitted[-1].thinking is not None and fake.submitted[-1].thinking.budget is None


async def test_ollama_think_levels(client: httpx.AsyncClient, fake: FakeEngine) -> None:
    body = {"model": MODEL, "messages": USER, "stream": False}
    r = await client.post("/api/chat", json={**body, "think": "high"})
    assert r.status_code == 200, r.text
    assert r.json()["message"]["thinking"].strip() == THINKING
    r = await client.post("/api/chat", json={**body, "think": False})
    assert r.status_code == 200, r.text
    assert fake.submitted[-1].thinking is not None and fake.submitted[-1].thinking.budget == 0
    r = await client.post("/api/chat", json={**body, "think": "extreme"})
    assert r.status_code == 400 and "think" in r.text
    r = await client.post("/api/generate", json={"model": MODEL, "prompt": "Hi", "stream": False,
                                                 "think": "low"})  # fmt: skip
    assert r.status_code == 200, r.text
    assert fake.submitted[-1].thinking is not None
