"""An app on the fake engine with real MCP servers configured (shared by the MCP tests)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from server.app import create_app
from server.config import AuthSection, McpSection, Settings, TracingSection
from server.mcp.settings import mcp_servers
from tests.kvserve_process import free_port
from tests.mcp.servers import stdio_command

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
