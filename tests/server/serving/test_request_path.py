"""A request runs only the serving code that applies to it (docs/architecture.md, "One
request's path"): a text-only chat without tools runs no image, replay, splice or
thinking code, and an Ollama chat without keep_alive no keep_alive code; a request that
needs them still runs them (the check could fail both ways)."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from server.app import create_app
from server.config.tree import ModelSection, Settings
from tests.fakes import FakeEngine
from tests.server.api.test_openai_api import MODEL

ROOT = Path(__file__).parents[3]
HERMES = ROOT / "tests" / "chat" / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"
OPTIONAL = {
    "server/serving/media.py",
    "server/serving/replay.py",
    "server/serving/spliced.py",
    "server/serving/thinking.py",
    "server/models/keep_alive.py",
    "server/http/management.py",
}
USER = {"role": "user", "content": "What is 2 + 3?"}
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}  # fmt: skip
TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}


async def files_run(send: Callable[[], Awaitable[httpx.Response]]) -> set[str]:
    """The optional serving files whose functions the request called (after a warm-up)."""
    assert (await send()).status_code == 200
    seen: set[str] = set()

    def profile(frame: Any, event: str, arg: Any) -> None:
        name = frame.f_code.co_filename
        if event == "call" and name.startswith(str(ROOT)):
            path = name[len(str(ROOT)) + 1 :]
            if path in OPTIONAL:
                seen.add(path)

    sys.setprofile(profile)
    try:
        response = await send()
    finally:
        sys.setprofile(None)
    assert response.status_code == 200, response.text
    return seen


def client(fake: FakeEngine) -> httpx.AsyncClient:
    settings = Settings(models=(ModelSection(id=MODEL, chat_template=str(HERMES)),))
    app = create_app(settings, engine=fake)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


async def test_a_text_only_chat_runs_no_image_replay_splice_or_thinking_code() -> None:
    async with client(FakeEngine(n_ctx=4096)) as c:
        body = {"model": MODEL, "messages": [USER], "max_tokens": 4}
        assert await files_run(lambda: c.post("/v1/chat/completions", json=body)) == set()


async def test_a_tool_turn_sent_back_opens_the_replay_memory() -> None:
    async with client(FakeEngine(n_ctx=4096)) as c:
        messages = [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "5"}]  # fmt: skip
        body = {"model": MODEL, "messages": messages, "tools": [TOOL], "max_tokens": 4}
        ran = await files_run(lambda: c.post("/v1/chat/completions", json=body))
        assert "server/serving/replay.py" in ran


async def test_an_image_part_runs_the_image_code() -> None:
    async with client(FakeEngine(n_ctx=4096, vision=True)) as c:
        png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
        part = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}}
        content = [{"type": "text", "text": "What is it?"}, part]
        body = {"model": MODEL, "messages": [{"role": "user", "content": content}],
                "max_tokens": 4}  # fmt: skip
        ran = await files_run(lambda: c.post("/v1/chat/completions", json=body))
        assert "server/serving/media.py" in ran


async def test_an_ollama_chat_without_keep_alive_runs_no_keep_alive_code() -> None:
    async with client(FakeEngine(n_ctx=4096)) as c:
        body = {"model": MODEL, "messages": [USER], "stream": False}
        assert await files_run(lambda: c.post("/api/chat", json=body)) == set()
        kept = {**body, "keep_alive": "10m"}
        ran = await files_run(lambda: c.post("/api/chat", json=kept))
        assert "server/models/keep_alive.py" in ran
