"""The configured MCP servers, by label: their connections, opened on first use and
closed when the app stops. A request that brings headers of its own (OpenAI `headers`,
Anthropic `authorization_token`) gets a connection of its own for that request only, to
the same configured server.

The `mcp` SDK behind a connection costs about a second to import, so `connection` is
imported when a configured server is first used, never at start-up: a kvserve with no
MCP servers (most of them) does not pay for it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from server.mcp.settings import McpSection, McpServerSection

if TYPE_CHECKING:
    from server.mcp.connection import McpConnection


class McpManager:
    def __init__(self, section: McpSection, servers: tuple[McpServerSection, ...]) -> None:
        self.section = section
        self.servers = {s.label: s for s in servers}
        self._shared: dict[str, McpConnection] = {}

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
        """A connection with this request's own headers; the caller closes it."""
        return self._open(label, headers)

    def _open(self, label: str, headers: dict[str, str] | None) -> McpConnection:
        from server.mcp.connection import McpConnection  # the SDK, on first use (above)

        return McpConnection(self.servers[label], self.section.connect_timeout_s, headers)

    async def close(self) -> None:
        for conn in self._shared.values():
            await conn.close()
        self._shared.clear()
