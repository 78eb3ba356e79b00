"""`context_overflow = "drop_oldest"`: which turns go, that the cut is the one dropping
one turn at a time would find, in O(log n) renders off the event loop (issue 17, item
12), and the cap on the number of messages."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import pytest

from chat import ChatOptions, ChatTemplate, plan_chat
from engine.client import fits_context
from server.serving import prepare
from server.serving.prepare import keep_turns_from, plan_within_context, turn_starts
from tests.conftest import ClientFactory
from tests.fakes import FakeEngine
from tests.server.api.test_openai_api import MODEL, assert_error


def m(role: str, text: str = "") -> dict:
    return {"role": role, "content": text or role}


def test_the_oldest_turn_after_the_system_messages_goes_whole() -> None:
    calls = {**m("assistant"), "tool_calls": [{"id": "c1"}]}
    messages = [m("system"), m("user", "u1"), calls, m("tool"), m("assistant", "a1"),
                m("user", "u2"), m("assistant", "a2"), m("user", "u3")]  # fmt: skip
    starts = turn_starts(messages)
    assert len(starts) == 3  # the last turn always stays: at most 2 can go
    once = keep_turns_from(messages, starts, 1)
    assert once == [m("system"), m("user", "u2"), m("assistant", "a2"), m("user", "u3")]
    assert keep_turns_from(messages, starts, 2) == [m("system"), m("user", "u3")]


def test_without_a_system_message() -> None:
    messages = [m("user", "u1"), m("user", "u2")]
    assert keep_turns_from(messages, turn_starts(messages), 1) == [m("user", "u2")]
    assert turn_starts([m("user", "u1")]) == [0]  # nothing to drop


def one_at_a_time(engine: FakeEngine, template: ChatTemplate, messages: list[dict],
                  max_tokens: int) -> int:  # fmt: skip
    """What dropping the oldest turn until it fits finds: the messages dropped."""
    starts = turn_starts(messages)
    for turn in range(len(starts)):
        kept = keep_turns_from(messages, starts, turn)
        text = plan_chat(template, kept, ChatOptions()).prompt.text
        if fits_context(len(engine.tokenize(text)), max_tokens, engine.info.n_ctx):
            return len(messages) - len(kept)
    return starts[-1] - starts[0]


@pytest.mark.parametrize("n_ctx", [40, 120, 300, 700, 2000, 5000])
async def test_the_search_finds_the_cut_of_dropping_one_turn_at_a_time(n_ctx: int) -> None:
    engine = FakeEngine(n_ctx=n_ctx)
    template = ChatTemplate(None, bos_token="", eos_token="", add_bos=False)
    messages = [m("system", "Be brief.")]
    for i in range(40):  # turns of different lengths, some with tool calls and results
        messages.append(m("user", f"question {i} " + "x" * (i * 7 % 23)))
        if i % 3 == 0:
            call = {"id": f"c{i}", "type": "function",
                    "function": {"name": "f", "arguments": "{}"}}  # fmt: skip
            messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": f"c{i}", "content": "r" * i}]  # fmt: skip
        messages.append(m("assistant", "answer " + "y" * (i * 11 % 31)))
    messages.append(m("user", "last"))
    plan, prompt, dropped = await plan_within_context(
        engine, template, messages, ChatOptions(), 8, "drop_oldest"
    )
    assert dropped == one_at_a_time(engine, template, messages, 8)
    assert plan.prompt.text.startswith("<|im_start|>system\nBe brief.")
    assert len(prompt) == len(plan.prompt.text.encode())


async def test_a_20000_turn_chat_is_cut_in_few_renders_off_the_event_loop(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeEngine(n_ctx=512)
    client = make_client(fake)
    served = client._transport.app.state.models.default  # type: ignore[attr-defined]
    served.context_overflow = "drop_oldest"
    loop_thread = threading.get_ident()
    rendering, health_answered = threading.Event(), threading.Event()
    renders: list[tuple[int, int]] = []  # (thread, messages) of each render
    real_render = ChatTemplate.render

    def spy(self: ChatTemplate, messages: Any, **kw: Any) -> Any:
        renders.append((threading.get_ident(), len(messages)))
        assert len(renders) <= 64, "one render per dropped turn"
        if len(renders) == 1:
            rendering.set()
            # On the event loop this wait would block the /health request below.
            assert health_answered.wait(10), "the event loop was blocked by the render"
        return real_render(self, messages, **kw)

    monkeypatch.setattr(ChatTemplate, "render", spy)
    messages = [m("system", "Be brief.")]
    for i in range(20_000):
        messages += [m("user", f"u{i}"), m("assistant", f"a{i}")]
    messages.append(m("user", "last"))
    body = {"model": MODEL, "messages": messages, "max_tokens": 16}
    chat = asyncio.create_task(client.post("/v1/chat/completions", json=body, timeout=120))
    while not rendering.is_set():
        assert not chat.done(), chat.result().text
        await asyncio.sleep(0.01)
    assert (await client.get("/health")).status_code == 200
    health_answered.set()
    r = await chat
    assert r.status_code == 200, r.text
    assert len(renders) <= 2 + 2 * 16  # whole, last turn, doubling and halving (n < 2**16)
    assert all(thread != loop_thread for thread, _ in renders)
    dropped = int(r.headers["X-Kvserve-Dropped-Messages"])
    assert dropped % 2 == 0 and 0 < dropped < len(messages) - 1
    prompt = bytes(fake.submitted[0].prompt_tokens).decode()
    assert prompt.startswith("<|im_start|>system\nBe brief.") and "u19999" in prompt
    assert len(prompt.encode()) < 512  # room for one token (max_tokens is cut at the end)
    one_more = [messages[0], *messages[dropped - 1 :]]  # the turn before the cut, kept
    assert len(real_render(served.template, one_more).text.encode()) >= 512


async def test_a_max_tokens_past_the_context_drops_no_turn_that_fits(
    make_client: ClientFactory,
) -> None:
    """An agent's max_tokens 32000 on a small context: what must fit is the prompt and
    the one token the engine admits it with (its max_tokens is cut where the context
    ends), so every turn of a conversation that fits stays, and the reply ends there."""
    fake = FakeEngine(n_ctx=512, reply="y" * 400)
    fake.context_ends = True
    client = make_client(fake)
    served = client._transport.app.state.models.default  # type: ignore[attr-defined]
    served.context_overflow = "drop_oldest"
    messages = [m("system", "Be brief."), m("user", "u1"), m("assistant", "a1"),
                m("user", "u2" + "x" * 300)]  # fmt: skip
    body = {"model": MODEL, "messages": messages, "max_tokens": 32000}
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.headers["X-Kvserve-Dropped-Messages"] == "0"
    prompt = bytes(fake.submitted[0].prompt_tokens).decode()
    assert "u1" in prompt and "a1" in prompt
    assert r.json()["choices"][0]["finish_reason"] == "length"  # the context ran out
    assert len(prompt) + r.json()["usage"]["completion_tokens"] == 512
    # One turn more than the context holds: only the oldest goes.
    messages[-1] = m("user", "u2" + "x" * 420)
    r = await client.post("/v1/chat/completions", json={**body, "messages": messages})
    assert r.status_code == 200, r.text
    assert r.headers["X-Kvserve-Dropped-Messages"] == "2"


async def test_more_messages_than_the_cap_is_a_400_naming_the_field(
    client: httpx.AsyncClient, fake: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    over = [m("user", "a")] * (prepare.MAX_MESSAGES + 1)
    r = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": over})
    assert "100,000" in assert_error(r, 400, "messages")["message"]
    monkeypatch.setattr(prepare, "MAX_MESSAGES", 3)
    four = [m("user", "a"), m("assistant", "b")] * 2
    r = await client.post("/v1/responses", json={"model": MODEL, "input": four})
    assert_error(r, 400, "input")
    headers = {"anthropic-version": "2023-06-01"}
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        body = {"model": MODEL, "max_tokens": 4, "messages": four}
        r = await client.post(path, json=body, headers=headers)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["message"].startswith("messages:")
    three = four[:3]
    r = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": three})
    assert r.status_code == 200, r.text
    assert fake.submitted and len(fake.submitted) == 1
