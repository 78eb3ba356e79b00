"""MCP tool entries of a request -> `McpRef`s, each field checked and refused by name.

OpenAI's shape (Responses, and Chat Completions as a kvserve extension):
`{"type": "mcp", "server_label", "server_url", "allowed_tools", "require_approval",
"headers", "authorization", "server_description"}`. Anthropic's MCP connector:
`{"type": "url", "url", "name", "authorization_token", "tool_configuration":
{"enabled", "allowed_tools"}}`.
"""

from __future__ import annotations

from typing import Any

from server.config.mcp import header_problem
from server.errors import BadRequest, Unsupported
from server.mcp.toolset import McpRef

# OpenAI fields for hosted connectors and deferred tool search: nothing of the kind here.
_OPENAI_UNSUPPORTED = ("connector_id", "tunnel_id", "allowed_callers", "defer_loading")
_OPENAI_KNOWN = {
    "type",
    "server_label",
    "server_url",
    "allowed_tools",
    "require_approval",
    "headers",
    "authorization",
    "server_description",
    *_OPENAI_UNSUPPORTED,
}


def _names(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRequest(f"'{where}' must be a list of tool names", param=where)
    return tuple(value)


def _filter_names(value: Any, where: str) -> tuple[str, ...]:
    """A list of names, or OpenAI's filter object `{"tool_names": [...], "read_only"}`."""
    if isinstance(value, list):
        return _names(value, where)
    if not isinstance(value, dict):
        raise BadRequest(f"'{where}' must be a list of tool names or a filter object",
                         param=where)  # fmt: skip
    if value.get("read_only") is not None:
        raise Unsupported(f"{where}.read_only", "filter by tool names")
    for key in value:
        if key not in ("tool_names", "read_only"):
            raise BadRequest(f"'{where}.{key}' is not a filter field", param=f"{where}.{key}")
    return _names(value.get("tool_names", []), f"{where}.tool_names")


def _approval(value: Any, where: str) -> Any:
    if value is None:
        return "always"  # OpenAI's default: ask before any call
    if value in ("always", "never"):
        return value
    if not isinstance(value, dict):
        raise BadRequest(f"'{where}' must be 'always', 'never' or a filter object", param=where)
    rule = {}
    for key, names in value.items():
        if key not in ("always", "never"):
            raise BadRequest(f"'{where}.{key}' must be 'always' or 'never'", param=f"{where}.{key}")
        rule[key] = _filter_names(names, f"{where}.{key}")
    return rule


def _headers(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and k and isinstance(v, str) for k, v in value.items()
    ):
        raise BadRequest(f"'{where}' must map header names to strings", param=where)
    for name, text in value.items():
        problem = header_problem(name, text)
        if problem is not None:
            raise BadRequest(f"'{where}': {problem}", param=where)
    return dict(value)


def _bearer(token: str, where: str) -> str:
    value = "Bearer " + token
    if header_problem("Authorization", value) is not None:
        raise BadRequest(f"'{where}' has a line break or NUL", param=where)
    return value


def openai_ref(tool: dict[str, Any], where: str) -> McpRef:
    for key in _OPENAI_UNSUPPORTED:
        if tool.get(key) is not None:
            raise Unsupported(f"{where}.{key}", "only configured MCP servers (server_label)")
    for key in tool:
        if key not in _OPENAI_KNOWN:
            raise BadRequest(f"'{where}.{key}' is not a field of an mcp tool",
                             param=f"{where}.{key}")  # fmt: skip
    label = tool.get("server_label")
    if not isinstance(label, str) or not label:
        raise BadRequest(f"'{where}.server_label' must be a non-empty string",
                         param=f"{where}.server_label")  # fmt: skip
    url = tool.get("server_url")
    if url is not None and not isinstance(url, str):
        raise BadRequest(f"'{where}.server_url' must be a string", param=f"{where}.server_url")
    for key in ("server_description", "authorization"):
        if tool.get(key) is not None and not isinstance(tool[key], str):
            raise BadRequest(f"'{where}.{key}' must be a string", param=f"{where}.{key}")
    allowed = tool.get("allowed_tools")
    headers = _headers(tool["headers"], f"{where}.headers") if tool.get("headers") else {}
    if tool.get("authorization"):
        headers["Authorization"] = _bearer(tool["authorization"], f"{where}.authorization")
    return McpRef(
        where, label, url,
        None if allowed is None else _filter_names(allowed, f"{where}.allowed_tools"),
        _approval(tool.get("require_approval"), f"{where}.require_approval"),
        headers or None,
        headers_field="headers" if tool.get("headers") else "authorization",
    )  # fmt: skip


def anthropic_ref(server: Any, where: str) -> McpRef:
    """One `mcp_servers` entry (disabled: checked, offers no tools, never contacted)."""
    if not isinstance(server, dict):
        raise BadRequest(f"'{where}' must be an object", param=where)
    if server.get("type") != "url":
        raise BadRequest(f"'{where}.type' must be 'url'", param=f"{where}.type")
    for key in server:
        if key not in ("type", "url", "name", "authorization_token", "tool_configuration"):
            raise BadRequest(f"'{where}.{key}' is not a field of an MCP server",
                             param=f"{where}.{key}")  # fmt: skip
    url, name = server.get("url"), server.get("name")
    if not isinstance(url, str) or not url:
        raise BadRequest(f"'{where}.url' must be a non-empty string", param=f"{where}.url")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"'{where}.name' must be a non-empty string", param=f"{where}.name")
    token = server.get("authorization_token")
    if token is not None and not isinstance(token, str):
        raise BadRequest(f"'{where}.authorization_token' must be a string",
                         param=f"{where}.authorization_token")  # fmt: skip
    bearer = _bearer(token, f"{where}.authorization_token") if token else None
    config = server.get("tool_configuration") or {}
    if not isinstance(config, dict):
        raise BadRequest(f"'{where}.tool_configuration' must be an object",
                         param=f"{where}.tool_configuration")  # fmt: skip
    for key in config:
        if key not in ("enabled", "allowed_tools"):
            raise BadRequest(f"'{where}.tool_configuration.{key}' is not a field",
                             param=f"{where}.tool_configuration.{key}")  # fmt: skip
    enabled = config.get("enabled", True)
    if not isinstance(enabled, bool):
        raise BadRequest(f"'{where}.tool_configuration.enabled' must be a boolean",
                         param=f"{where}.tool_configuration.enabled")  # fmt: skip
    allowed = config.get("allowed_tools")
    at = f"{where}.tool_configuration.allowed_tools"
    names = None if allowed is None else _names(allowed, at)
    return McpRef(
        where, name, url, names if enabled else (),
        "never",  # the connector has no approvals: the tools run
        {"Authorization": bearer} if bearer else None, "url", "name", "authorization_token",
    )  # fmt: skip
