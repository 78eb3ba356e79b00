"""The configured MCP servers, by label: their connections, opened on first use and
closed when the app stops. A request that brings headers of its own (OpenAI `headers`,
Anthropic `authorization_token`) gets a connection of its own for that request only, to
the same configured server; those are counted and bounded (`max_private_connections`),
so many requests with headers cannot open connections without end.

The `mcp` SDK behind a connection costs about a second to import, so `connection` is
imported when a configured server is first used, never at start-up: a kvserve with no
MCP servers (most of them) does not pay for it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from server.config.mcp import McpSection, McpServerSection
from server.mcp.outcome import McpBusy

if TYPE_CHECKING:
    from server.mcp.connection import McpConnection


class McpManager:
    def __init__(self, section: McpSection, servers: tuple[McpServerSection, ...]) -> None:
        self.section = section
        self.servers = {s.label: s for s in servers}
        self._shared: dict[str, McpConnection] = {}
        self.num_private = 0  # private connections made and not yet closed

    def by_url(self, url: str) -> McpServerSection | None:
        norm = url.rstrip("/")
        return next((s for s in self.servers.values() if s.url and s.url.rstrip("/") == norm),
                    None)  # fmt: skip

    def connection(self, label: str) -> McpConnection:
        """The shared connection to a configured server."""
        conn = self._shared.get(label)
        if conn is None:
            conn = self._open(label, None)
            self._shared[label] = conn
        return conn

    def private(self, label: str, headers: dict[str, str]) -> McpConnection:
        """A connection with this request's own headers, counted until the caller closes
        it. McpBusy when `max_private_connections` are open already; ValueError for a
        stdio server (the request is refused before: a child process takes no headers)."""
        if self.servers[label].transport == "stdio":
            raise ValueError(f"the stdio MCP server '{label}' takes no headers")
        limit = self.section.max_private_connections
        if self.num_private >= limit:
            raise McpBusy(f"{limit} MCP connections with a request's own headers are open "
                          "(mcp.max_private_connections); try again shortly")  # fmt: skip
        self.num_private += 1
        return self._open(label, headers, self._released)

    def _released(self) -> None:
        self.num_private -= 1

    def _open(
        self, label: str, headers: dict[str, str] | None, on_close: Callable[[], None] | None = None
    ) -> McpConnection:
        from server.mcp.connection import McpConnection  # the SDK, on first use (above)

        section = self.section
        return McpConnection(self.servers[label], section.connect_timeout_s, headers,
                             retry_s=section.connect_retry_s, on_close=on_close)  # fmt: skip

    async def close(self) -> None:
        for conn in self._shared.values():
            await conn.close()
        self._shared.clear()
