"""The configured MCP servers, by label: their connections, opened on first use and
closed when the app stops. A request that brings headers of its own (OpenAI `headers`,
Anthropic `authorization_token`) gets a connection of its own for that request only, to
the same configured server."""

from __future__ import annotations

from server.mcp.connection import McpConnection
from server.mcp.settings import McpSection, McpServerSection


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
            conn = McpConnection(self.servers[label], self.section.connect_timeout_s)
            self._shared[label] = conn
        return conn

    def private(self, label: str, headers: dict[str, str]) -> McpConnection:
        """A connection with this request's own headers; the caller closes it."""
        return McpConnection(self.servers[label], self.section.connect_timeout_s, headers)

    async def close(self) -> None:
        for conn in self._shared.values():
            await conn.close()
        self._shared.clear()
