"""`[mcp]` and `[[mcp_servers]]`: the MCP servers kvserve may call, and the loop's bounds.

Only these servers are ever contacted: a request names one by its label (and may repeat
its URL), never by an address of its own choosing.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from server.config.tenant import tenant_of
from server.config.values import HEADER_NAME, ConfigError, coerce

_LABEL = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
TRANSPORTS = ("streamable_http", "sse", "stdio")


@dataclass(frozen=True)
class McpSection:
    max_tool_iterations: int = 5  # model rounds that may call tools, per request
    max_result_chars: int = 16384  # a tool result longer than this is cut, with a note
    connect_timeout_s: float = 10.0  # connecting to a server and listing its tools
    # A connect that failed is not tried again for this long: the requests meanwhile fail
    # at once with its reason, instead of each waiting connect_timeout_s on a server that
    # is down. Short, so a server that comes back is used again within seconds.
    connect_retry_s: float = 5.0
    # Per request: its tool calls end by this many seconds after the loop starts (a call
    # still running is cut, later ones are not run; the model then answers without tools),
    # so one request holds its slot for about this long, not rounds x calls x timeout_s.
    max_loop_s: float = 120.0
    max_calls_per_round: int = 8  # MCP calls run per model round; the rest get an error
    # Connections opened for a request's own headers (each an HTTP session and a task),
    # open at once over all requests; past it a request with headers is refused (429).
    max_private_connections: int = 16


@dataclass(frozen=True)
class McpServerSection:
    """One `[[mcp_servers]]` entry."""

    label: str = ""
    url: str = ""  # streamable HTTP (or SSE with transport = "sse")
    transport: str = ""  # "streamable_http" (default with url), "sse", "stdio" (with command)
    command: str = ""  # a stdio server: the program and its arguments
    args: tuple[str, ...] = ()
    headers: tuple[tuple[str, str], ...] = ()  # sent with every HTTP request
    bearer_token_env: str = ""  # Authorization: Bearer <the value of this variable>
    allowed_tools: tuple[str, ...] = ()  # empty: every tool the server lists
    timeout_s: float = 30.0  # one tool call
    api_keys: tuple[str, ...] = ()  # the API keys that may use it; empty: every caller
    tenants: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    def http_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.bearer_token_env:
            headers["Authorization"] = "Bearer " + os.environ.get(self.bearer_token_env, "")
        return headers

    def usable_by(self, tenant: str) -> bool:
        return not self.api_keys or tenant in self.tenants


_SCALARS = {"label": str, "url": str, "transport": str, "command": str, "args": tuple[str, ...],
            "bearer_token_env": str, "allowed_tools": tuple[str, ...], "timeout_s": float,
            "api_keys": tuple[str, ...]}  # fmt: skip


def header_problem(name: str, value: str) -> str | None:
    """Why a header cannot be sent (None: it can). Shared with the request's `headers`."""
    if not HEADER_NAME.match(name):
        return f"{name!r} is not a valid header name"
    if any(c in value for c in "\r\n\0"):
        return f"the value of {name!r} has a line break or NUL"
    return None


def _headers(key: str, value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ConfigError(f"{key}: expected a table of header names to strings")
    for name, text in value.items():
        problem = header_problem(name, text)
        if problem is not None:
            raise ConfigError(f"{key}: {problem}")
    return tuple(value.items())


def _entry(key: str, table: Any) -> McpServerSection:
    if not isinstance(table, dict):
        raise ConfigError(f"{key}: expected a table")
    values: dict[str, Any] = {}
    for name, value in table.items():
        if name == "headers":
            values[name] = _headers(f"{key}.headers", value)
        elif name in _SCALARS:
            values[name] = coerce(f"{key}.{name}", value, _SCALARS[name], from_text=False)
        else:
            raise ConfigError(f"{key}.{name}: unknown key")
    if not _LABEL.match(values.get("label", "")):
        raise ConfigError(f"{key}.label: required, 1-64 letters, digits, '_' or '-'")
    url, command = values.get("url", ""), values.get("command", "")
    if bool(url) == bool(command):
        raise ConfigError(f"{key}.url: give either url (HTTP) or command (stdio)")
    transport = values.get("transport") or ("stdio" if command else "streamable_http")
    if transport not in TRANSPORTS or (transport == "stdio") != bool(command):
        raise ConfigError(f"{key}.transport: 'streamable_http' or 'sse' with url, 'stdio' "
                          "with command")  # fmt: skip
    if url and not url.startswith(("http://", "https://")):
        raise ConfigError(f"{key}.url: an http:// or https:// URL")
    token_env = values.get("bearer_token_env", "")
    if token_env and command:
        raise ConfigError(f"{key}.bearer_token_env: only for an HTTP server (url); a stdio "
                          "server has no headers")  # fmt: skip
    if token_env and not os.environ.get(token_env):
        # checked at start-up: a missing token would only show as 401s at the first call
        raise ConfigError(f"{key}.bearer_token_env: the environment variable '{token_env}' "
                          "is not set (or empty)")  # fmt: skip
    if values.get("headers") and command:
        raise ConfigError(f"{key}.headers: only for an HTTP server (url)")
    if values.get("timeout_s", 30.0) <= 0:
        raise ConfigError(f"{key}.timeout_s: must be above 0")
    values["transport"] = transport
    tenants = frozenset(tenant_of(k) for k in values.get("api_keys", ()))
    return McpServerSection(**values, tenants=tenants)


def mcp_servers(tables: Any) -> tuple[McpServerSection, ...]:
    """The `[[mcp_servers]]` entries, checked; labels unique."""
    if tables is None:
        return ()
    if not isinstance(tables, list):
        raise ConfigError("mcp_servers: expected [[mcp_servers]] tables")
    out = tuple(_entry(f"mcp_servers[{i}]", t) for i, t in enumerate(tables))
    labels = [s.label for s in out]
    for i, label in enumerate(labels):
        if label in labels[:i]:
            raise ConfigError(f"mcp_servers[{i}].label: '{label}' is used twice")
    return out


def validate_mcp(section: McpSection) -> None:
    if not 0 <= section.max_tool_iterations <= 64:
        raise ConfigError("mcp.max_tool_iterations: between 0 and 64")
    if section.max_result_chars < 256:
        raise ConfigError("mcp.max_result_chars: at least 256")
    if section.connect_timeout_s <= 0:
        raise ConfigError("mcp.connect_timeout_s: must be above 0")
    if section.connect_retry_s < 0:
        raise ConfigError("mcp.connect_retry_s: must be 0 or more")
    if section.max_loop_s <= 0:
        raise ConfigError("mcp.max_loop_s: must be above 0")
    if not 1 <= section.max_calls_per_round <= 128:
        raise ConfigError("mcp.max_calls_per_round: between 1 and 128")
    if section.max_private_connections < 1:
        raise ConfigError("mcp.max_private_connections: at least 1")
