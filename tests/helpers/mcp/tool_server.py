"""A real MCP server for the tests, on the official SDK: `python tool_server.py http PORT
LOG` (streamable HTTP on loopback, path /mcp), `python tool_server.py sse PORT LOG` (SSE,
path /sse) or `python tool_server.py stdio LOG`.

Its tools: `add`, `echo`, `whoami` (the Authorization header it got), `header` (any
header it got), `trace` (the W3C traceparent it got, as HTTP header and in `_meta`), `slow` (sleeps; `stall` the same for 60 s whatever its tag;
writes "start <id>" / "cancelled <id>" / "done <id>" lines to LOG, so a test can see that
a call was cancelled), `boom` (raises), `huge` (returns n characters), `grow` (adds a
tool and announces the new list: notifications/tools/list_changed).
"""

from __future__ import annotations

import asyncio
import json
import sys

from mcp.server.mcpserver import Context, MCPServer

LOG = sys.argv[-1]
server = MCPServer("kvserve-test-tools", log_level="WARNING")


def note(line: str) -> None:
    with open(LOG, "a") as fh:
        fh.write(line + "\n")


@server.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@server.tool()
def echo(text: str) -> str:
    """Echo the text back."""
    return text


@server.tool()
def whoami(ctx: Context) -> str:
    """The Authorization header this call came with."""
    headers = ctx.headers or {}
    return headers.get("authorization", "none")


@server.tool()
def header(name: str, ctx: Context) -> str:
    """The value of the request header `name` ("none" if absent)."""
    return (ctx.headers or {}).get(name.lower(), "none")


@server.tool()
def trace(ctx: Context) -> str:
    """The traceparent this call came with: the HTTP header and the request's `_meta`."""
    meta = ctx.request_context.meta or {}
    got = {"header": (ctx.headers or {}).get("traceparent"), "meta": meta.get("traceparent")}
    return json.dumps(got)


@server.tool()
async def slow(seconds: float, tag: str) -> str:
    """Sleep for `seconds`."""
    note(f"start {tag}")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        note(f"cancelled {tag}")
        raise
    note(f"done {tag}")
    return f"slept {seconds}"


@server.tool()
async def stall(tag: str) -> str:
    """Takes a minute (a call to cancel; `tag` is not used)."""
    note("start stall")
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        note("cancelled stall")
        raise
    note("done stall")
    return "stalled"


@server.tool()
def boom() -> str:
    """Always fails."""
    raise RuntimeError("the tool exploded")


@server.tool()
def huge(n: int) -> str:
    """n characters."""
    return "x" * n


@server.tool()
async def grow(ctx: Context) -> str:
    """Add the tool `extra` and announce it."""
    def extra() -> str:
        """A tool that appeared later."""
        return "extra"

    server.add_tool(extra)
    await ctx.notify_tools_changed()  # 2026-07-28 clients: their subscriptions/listen stream
    await ctx.session.send_tool_list_changed()  # older clients: the notification
    return "grown"


if __name__ == "__main__":
    if sys.argv[1] == "http":
        asyncio.run(server.run_streamable_http_async(port=int(sys.argv[2])))
    elif sys.argv[1] == "sse":
        asyncio.run(server.run_sse_async(port=int(sys.argv[2])))
    else:
        asyncio.run(server.run_stdio_async())
