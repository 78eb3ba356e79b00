"""A max_tokens past what the context leaves is not refused: the reply ends where the
context does, with each API's own word for a cut answer (OpenAI Chat `length`,
Anthropic `max_tokens`), as llama-server does (issue 46). A prompt that leaves no room
at all keeps its 400, worded on Anthropic's route as its clients parse it."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.conftest import ClientFactory
from tests.fakes import FakeEngine
from tests.server.api.responses.test_responses import named_events
from tests.server.api.test_openai_api import MODEL

N_CTX = 256
HEADERS = {"anthropic-version": "2023-06-01"}
ASKED = 32000  # what Claude Code, opencode and Qwen Code send whatever the context


@pytest.fixture
def fake() -> FakeEngine:
    # A reply longer than the context leaves, so only the context can end it.
    fake = FakeEngine(n_ctx=N_CTX, reply="y" * (2 * N_CTX))
    fake.context_ends = True
    return fake


def user(text: str = "Hi") -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def chat_stream_chunks(body: str) -> list[dict[str, Any]]:
    lines = [line[6:] for line in body.splitlines() if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


async def test_chat_ends_with_length_where_the_context_does(
    client: httpx.AsyncClient, fake: FakeEngine
) -> None:
    r = await client.post("/v1/chat/completions",
                          json={"model": MODEL, "messages": user(), "max_tokens": ASKED})  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["finish_reason"] == "length"
    usage = body["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == N_CTX
    assert fake.submitted[0].max_tokens == ASKED  # passed on whole: the engine cuts it
    r = await client.post("/v1/chat/completions", json={
        "model": MODEL, "messages": user(), "max_tokens": ASKED, "stream": True})  # fmt: skip
    chunks = chat_stream_chunks(r.text)
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert len(text) == usage["completion_tokens"]  # a fake token is a byte


async def test_messages_end_with_max_tokens_where_the_context_does(
    client: httpx.AsyncClient,
) -> None:
    body = {"model": MODEL, "max_tokens": ASKED, "messages": user()}
    r = await client.post("/v1/messages", json=body, headers=HEADERS)
    assert r.status_code == 200, r.text
    message = r.json()
    assert message["stop_reason"] == "max_tokens" and message["stop_sequence"] is None
    usage = message["usage"]
    assert usage["input_tokens"] + usage["output_tokens"] == N_CTX
    r = await client.post("/v1/messages", json={**body, "stream": True}, headers=HEADERS)
    events = named_events(r.text)
    delta = next(data for name, data in events if name == "message_delta")
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == usage["output_tokens"]


async def test_a_prompt_that_fills_the_context_is_worded_as_anthropic_words_it(
    make_client: ClientFactory,
) -> None:
    """The second wording (server/errors.py ContextTooLong): a prompt no longer than the
    context that leaves no token for the answer. Claude Code reads its figures back."""
    fake = FakeEngine(n_ctx=64)
    fake.context_ends = True
    client = make_client(fake)

    async def count(text: str) -> int:
        r = await client.post("/v1/messages/count_tokens", headers=HEADERS,
                              json={"model": MODEL, "messages": user(text)})  # fmt: skip
        assert r.status_code == 200, r.text
        return r.json()["input_tokens"]  # type: ignore[no-any-return]

    overhead = await count("x") - 1
    text = "x" * (64 - overhead)
    assert await count(text) == 64  # exactly the context: no room for one token
    r = await client.post("/v1/messages", headers=HEADERS,
                          json={"model": MODEL, "max_tokens": 100, "messages": user(text)})  # fmt: skip
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"] == (
        "input length and `max_tokens` exceed context limit: 64 + 100 "
        "> 64, decrease input length or `max_tokens` and try again"
    )
    # One token shorter is answered: the one token left is the whole reply.
    r = await client.post("/v1/messages", headers=HEADERS,
                          json={"model": MODEL, "max_tokens": 100, "messages": user(text[1:])})  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["stop_reason"] == "max_tokens" and r.json()["usage"]["output_tokens"] == 1
