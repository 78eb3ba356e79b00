"""What an MCP server gives back, as the rest of kvserve sees it: a tool, a call's
outcome, an unreachable server. Kept apart from `connection` so that the tool loop and
the toolset can name them without importing the `mcp` SDK (about a second at start-up,
which a server with no MCP servers configured never pays)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class McpUnavailable(Exception):
    """The server could not be reached, or could not list its tools."""


class McpBusy(Exception):
    """No connection of a request's own may open now (mcp.max_private_connections)."""


@dataclass(frozen=True, slots=True)
class McpTool:
    name: str
    description: str
    input_schema: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CallOutcome:
    """A tool call's result as the model will read it: `output` on success, else `error`."""

    output: str | None
    error: str | None
