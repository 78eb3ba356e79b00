"""A caller's tenant: the digest of their API key, which sessions, stored responses,
cached prefixes and MCP servers' key lists are kept under. One function, so the key a
request presents (server/http/deps.py) and the keys a config lists (server/config/mcp.py)
always name the same tenant; here, with the configured keys, because the config is the
leaf every server package reads (it imports none of them)."""

from __future__ import annotations

import hashlib


def tenant_of(api_key: str) -> str:
    """16 hex digits of the key's SHA-256: the key itself is never kept."""
    return hashlib.sha256(api_key.encode()).hexdigest()[:16]
