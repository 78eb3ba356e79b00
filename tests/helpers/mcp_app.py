"""An app on the fake engine with real MCP servers configured (shared by the MCP tests)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from server.app import create_app
from server.config.mcp import mcp_servers
from server.config.tree import AuthSection, McpSection, Settings, TracingSection
from tests.fakes import FakeEngine
from tests.helpers.mcp.servers import HttpMcp, http_mcp, stdio_command
from tests.kvserve_process import free_port

CALL = '{{"tool_calls": [{{"name": "{name}", "arguments": {args}}}]}}'


def call(name: str, args: str = "{}") -> str:
    return CALL.format(name=name, args=args)


def servers(url: str, log: Path, **per_label: dict[str, Any]) -> list[dict[str, Any]]:
    command, args = stdio_command(log)
    entries = [
        {"label": "tools", "url": url, "timeout_s": 30.0},
        {"label": "local", "command": command, "args": list(args)},
        {"label": "down", "url": f"http://127.0.0.1:{free_port()}/mcp"},
        {"label": "locked", "url": url.replace("127.0.0.1", "localhost"), "api_keys": ["k2"]},
    ]
    for entry in entries:
        entry.update(per_label.get(entry["label"], {}))
    return entries


@contextlib.asynccontextmanager
async def mcp_client(
    engine: Any, entries: list[dict[str, Any]], *, api_keys: tuple[str, ...] = (),
    tracing: TracingSection | None = None, **mcp: Any,
) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(mcp=McpSection(**{"connect_timeout_s": 30.0, **mcp}),
                        mcp_servers=mcp_servers(entries),
                        auth=AuthSection(api_keys=api_keys),
                        tracing=tracing or TracingSection())  # fmt: skip
    app = create_app(settings, engine=engine)
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://test",
                                     timeout=60) as client:  # fmt: skip
            yield client
    finally:
        await app.state.mcp.close()


def mcp_fixtures(**mcp: Any) -> tuple[Callable[..., Any], ...]:
    """The fixtures an MCP test module binds as `mcp_http, fake, client = mcp_fixtures()`:
    one real MCP server on streamable HTTP for the module, a roomy fake engine per test, and
    a client on an app with `servers()` configured and the [mcp] settings `mcp`. (A factory,
    not a conftest: `fake` and `client` mean other things to the rest of tests/server.)"""

    @pytest.fixture(scope="module")
    def mcp_http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpMcp]:
        with http_mcp(tmp_path_factory.mktemp("mcp")) as server:
            yield server

    @pytest.fixture
    def fake() -> FakeEngine:
        return FakeEngine(n_ctx=16384)

    @pytest.fixture
    async def client(fake: FakeEngine, mcp_http: HttpMcp, tmp_path: Path
                     ) -> AsyncIterator[httpx.AsyncClient]:  # fmt: skip
        async with mcp_client(fake, servers(mcp_http.url, tmp_path / "stdio.log"), **mcp) as c:
            yield c

    return mcp_http, fake, client
