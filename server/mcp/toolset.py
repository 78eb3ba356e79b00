"""The MCP tools one request may call: its `{"type": "mcp", ...}` entries checked against
the configured servers, their tools listed and filtered, and calls routed to the right
server. Built per request; `close()` ends the connections the request brought headers for.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from chat.tools import Tool
from server.config.mcp import McpServerSection
from server.mcp.manager import McpManager
from server.mcp.outcome import CallOutcome, McpTool, McpUnavailable
from server.telemetry import tracing

if TYPE_CHECKING:
    from server.mcp.connection import McpConnection  # the SDK, opened by the manager

# A request error naming the field: the API raises it in its own shape.
Refuse = Callable[[str, str], Exception]


@dataclass(frozen=True, slots=True)
class McpRef:
    """One request tool entry, parsed by the API adapter."""

    where: str  # the field it came from, for errors: "tools[2]"
    label: str
    url: str | None = None
    allowed_tools: tuple[str, ...] | None = None
    # "never", or "always" for every tool, or the tools that need (never) approval
    approval: Literal["never", "always"] | dict[str, tuple[str, ...]] = "never"
    headers: dict[str, str] | None = None
    # how the API names the fields, for its errors (Anthropic: "url", "name" and
    # "authorization_token"; OpenAI: "authorization" when only that one was given)
    url_field: str = "server_url"
    label_field: str = "server_label"
    headers_field: str = "headers"


@dataclass(slots=True)
class ServerTools:
    ref: McpRef
    connection: McpConnection
    private: bool
    tools: tuple[McpTool, ...] = ()
    error: str | None = None  # listing failed: the server offers nothing this turn

    def needs_approval(self, name: str) -> bool:
        rule = self.ref.approval
        if isinstance(rule, str):
            return rule == "always"
        if name in rule.get("never", ()):
            return False
        return "always" not in rule or name in rule["always"]


@dataclass(slots=True)
class Toolset:
    servers: list[ServerTools] = field(default_factory=list)
    max_chars: int = 16384

    def __bool__(self) -> bool:
        return bool(self.servers)

    def functions(self) -> tuple[Tool, ...]:
        """The MCP tools as the functions the model is offered."""
        return tuple(Tool(t.name, t.description, t.input_schema)
                     for s in self.servers for t in s.tools)  # fmt: skip

    def owner(self, name: str) -> ServerTools | None:
        return next((s for s in self.servers if any(t.name == name for t in s.tools)), None)

    def server(self, label: str) -> ServerTools | None:
        return next((s for s in self.servers if s.ref.label == label), None)

    async def call(
        self, label: str, name: str, arguments: dict[str, Any], parent: Any = None,
        budget_s: float | None = None,
    ) -> CallOutcome:  # fmt: skip
        """One tool call (within `budget_s`, the request's time left for calls), traced as
        an `mcp.call` span (a child of `parent`, the loop's round span, else of the current
        span); the span is current while the call runs, so the MCP request carries its
        `traceparent`."""
        server = self.server(label)
        if server is None:
            return CallOutcome(None, f"MCP server '{label}' is not offered in this request")
        attributes = {"kvserve.mcp.server": label, "gen_ai.tool.name": name,
                      "mcp.method.name": "tools/call"}  # fmt: skip
        began = time.monotonic()
        with tracing.span("mcp.call", parent=parent, **attributes) as span:
            outcome = await server.connection.call(name, arguments, self.max_chars, budget_s)
            if span is not None:
                span.set_attribute("kvserve.mcp.duration_s", round(time.monotonic() - began, 6))
                status = "failed" if outcome.error is not None else "completed"
                span.set_attribute("kvserve.mcp.outcome", status)
                if outcome.error is not None:
                    span.set_attribute("error.type", "tool_error")
                    tracing.failed(span, outcome.error[:512])
        return outcome

    async def close(self) -> None:
        """Close the request's private connections (the shared ones stay open)."""
        for server in self.servers:
            if server.private:
                with contextlib.suppress(Exception):
                    await server.connection.close()

    def close_soon(self) -> None:
        """`close()` in a task of its own: it runs even when the caller's task is being
        cancelled (an anyio cancel scope cancels every await of a cancelled request)."""
        if any(server.private for server in self.servers):
            task = asyncio.ensure_future(self.close())
            _closing.add(task)
            task.add_done_callback(_closing.discard)


_closing: set[asyncio.Future[None]] = set()  # kept referenced until they finish


def resolve(manager: McpManager, refs: list[McpRef], tenant: str, refuse: Refuse) -> Toolset:
    """The request's servers, checked: only configured ones, usable by this caller. Every
    ref is checked before any connection is made (a refusal leaves nothing to close); not
    connected yet (`list_tools` does that). McpBusy when no private connection may open."""
    checked = [(ref, _spec(manager, ref, tenant, refuse)) for ref in refs]
    for i, (ref, spec) in enumerate(checked):
        if any(s.label == spec.label or r.label == ref.label for r, s in checked[:i]):
            raise refuse(f"{ref.where}.{ref.label_field}", f"'{ref.label}' is named twice")
    toolset = Toolset(max_chars=manager.section.max_result_chars)
    try:
        for ref, spec in checked:
            private = bool(ref.headers)
            conn = (manager.private(spec.label, ref.headers or {}) if private
                    else manager.connection(spec.label))  # fmt: skip
            toolset.servers.append(ServerTools(ref, conn, private))
    except BaseException:
        toolset.close_soon()  # the private connections made before the refusal
        raise
    return toolset


def _spec(manager: McpManager, ref: McpRef, tenant: str, refuse: Refuse) -> McpServerSection:
    # By label; a request that names its own label (Anthropic's `name`) is matched
    # by its URL. Either way the URL, if given, must be the configured one.
    spec = manager.servers.get(ref.label)
    if spec is None and ref.url is not None:
        spec = manager.by_url(ref.url)
    if spec is None:
        field_ = ref.url_field if ref.url is not None else ref.label_field
        raise refuse(f"{ref.where}.{field_}", f"'{ref.url or ref.label}' is not an MCP "
                     "server configured on this server (only [[mcp_servers]] entries "
                     "are ever contacted)")  # fmt: skip
    if ref.url is not None and ref.url.rstrip("/") != spec.url.rstrip("/"):
        raise refuse(
            f"{ref.where}.{ref.url_field}",
            "this URL is not configured for "
            f"'{spec.label}'; kvserve only calls the URLs in its configuration",
        )
    if not spec.usable_by(tenant):
        raise refuse(f"{ref.where}.{ref.label_field}",
                     f"this API key may not use the MCP server '{spec.label}'")  # fmt: skip
    if ref.headers and spec.transport == "stdio":
        # a child process has no HTTP headers: they would be dropped, and each request
        # would start a process of its own
        raise refuse(f"{ref.where}.{ref.headers_field}", f"'{spec.label}' is a stdio MCP "
                     "server: it takes no headers (only HTTP servers do)")  # fmt: skip
    return spec


async def list_tools(toolset: Toolset, refuse: Refuse) -> None:
    """List each server's tools (cached by its connection), filtered by the configured and
    the requested `allowed_tools`. A server that cannot be reached offers nothing and
    keeps the error (reported in the output); two servers offering one name is a 400."""
    seen: dict[str, str] = {}
    for server in toolset.servers:
        spec = server.connection.spec
        if server.ref.allowed_tools == ():
            continue  # nothing of it is offered: not contacted
        try:
            tools = await server.connection.tools()
        except McpUnavailable as exc:
            server.error = f"MCP server '{spec.label}' is unavailable: {exc}"
            continue
        if spec.allowed_tools:
            tools = tuple(t for t in tools if t.name in spec.allowed_tools)
        if server.ref.allowed_tools is not None:
            tools = tuple(t for t in tools if t.name in server.ref.allowed_tools)
        for tool in tools:
            if tool.name in seen:
                where = f"{server.ref.where}.{server.ref.label_field}"
                raise refuse(where, f"the tool '{tool.name}' is offered by both "
                             f"'{seen[tool.name]}' and '{spec.label}'")  # fmt: skip
            seen[tool.name] = spec.label
        server.tools = tools
