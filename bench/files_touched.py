"""Which server files one request runs code in (issue 29: a request should touch few).

    python bench/files_touched.py            # counts and lists, this checkout
    python bench/files_touched.py --counts   # counts only

Three requests, each through the whole app (middleware included) on the fake engine
(tests/fakes.py): a chat completion, an Ollama /api/chat, and a Responses request whose
MCP tool runs on a real MCP server (the SDK's, on streamable HTTP, tests/helpers). Each is
sent once to warm up (first-call imports), then again under `sys.setprofile`; a file
counts when a function of it (not its module-level code) is called. Run from the checkout
to measure: it imports `server` from there, and looks for the test helpers where that
checkout keeps them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path.cwd()
sys.path.insert(0, str(ROOT))

CHAT = {"messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 8}
ADD = '{"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]}'


def first_module(*names: str) -> Any:
    """The first of these modules that this checkout has (the layout moved in issue 29)."""
    for name in names:
        with contextlib.suppress(ModuleNotFoundError):
            return importlib.import_module(name)
    raise ModuleNotFoundError(names[0])


async def touched(send: Callable[[], Awaitable[Any]]) -> dict[str, set[str]]:
    """The server files the request calls into, each with the functions called there."""
    await send()  # warm-up
    server = str(ROOT / "server") + "/"
    seen: dict[str, set[str]] = {}

    def profile(frame: Any, event: str, arg: Any) -> None:
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(server) and code.co_name != "<module>":
            path = code.co_filename[len(str(ROOT)) + 1 :]
            seen.setdefault(path, set()).add(code.co_qualname)

    sys.setprofile(profile)
    try:
        response = await send()
    finally:
        sys.setprofile(None)
    assert response.status_code == 200, response.text
    return dict(sorted(seen.items()))


async def measure(tmp: Path) -> dict[str, dict[str, set[str]]]:
    import httpx

    from server.app import create_app

    config = first_module("server.config.tree", "server.config")
    mcp_config = first_module("server.config.mcp", "server.mcp.config", "server.mcp.settings")
    fakes = importlib.import_module("tests.fakes")
    mcp_servers = first_module("tests.helpers.mcp.servers", "tests.mcp.servers")

    fake = fakes.FakeEngine(n_ctx=16384)
    model = fake.info.model_id
    out: dict[str, dict[str, set[str]]] = {}
    with mcp_servers.http_mcp(tmp) as mcp:
        entries = [{"label": "tools", "url": mcp.url, "timeout_s": 30.0}]
        settings = config.Settings(mcp_servers=mcp_config.mcp_servers(entries))
        app = create_app(settings, engine=fake)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=60) as c:

            def chat() -> Awaitable[Any]:
                return c.post("/v1/chat/completions", json={"model": model, **CHAT})

            def ollama() -> Awaitable[Any]:
                return c.post("/api/chat", json={"model": model, "stream": False, **CHAT})

            async def responses_mcp() -> Any:
                fake.replies = [ADD, "The sum is 5."]
                tool = {"type": "mcp", "server_label": "tools", "require_approval": "never"}
                choice = {"type": "mcp", "server_label": "tools", "name": "add"}
                body = {"model": model, "input": "2 + 3?", "tools": [tool], "tool_choice": choice}
                return await c.post("/v1/responses", json=body)

            out["chat completion"] = await touched(chat)
            out["Ollama /api/chat"] = await touched(ollama)
            out["Responses with an MCP tool"] = await touched(responses_mcp)
        await app.state.mcp.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--counts", action="store_true", help="counts only, no file lists")
    p.add_argument("--functions", action="store_true", help="each file's functions called too")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = asyncio.run(measure(Path(tmp)))
    for request, files in result.items():
        print(f"{request}: {len(files)} files")
        if not args.counts:
            for f, functions in files.items():
                print(f"    {f}")
                if args.functions:
                    for name in sorted(functions):
                        print(f"        {name}")


if __name__ == "__main__":
    main()
