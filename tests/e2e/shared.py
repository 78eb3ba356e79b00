"""What several end-to-end modules share: one keyed server process per module, and an
openai-agents run on its own event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from tests.kvserve_process import running


def keyed_server(key: str, *, admin: bool = False) -> Callable[..., Iterator[str]]:
    """A module's `server` fixture (`server = keyed_server(KEY)`): one server process for
    the module's tests, two slots, the API key `key` (`admin`: as an admin key, which
    model management takes); the fixture is its URL."""

    @pytest.fixture(scope="module")
    def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
        args, env = ["--parallel", "2", "--api-key", key], {}
        if admin:
            args, env = ["--parallel", "2"], {"KVSERVE_AUTH_ADMIN_API_KEYS": key}
        with running(args, tmp_path_factory.mktemp("kvserve"), env=env) as s:
            yield s.url

    return server


def run_agent(agent: Any, client: openai.AsyncOpenAI, prompt: str) -> Any:
    """`Runner.run(agent, prompt)` (four turns at most) on a new event loop; `client`, the
    agent model's, is closed in that loop (closed after it, it would leak its sockets)."""
    from agents import Runner

    async def run() -> Any:
        try:
            return await Runner.run(agent, prompt, max_turns=4)
        finally:
            await client.close()

    return asyncio.run(run())
