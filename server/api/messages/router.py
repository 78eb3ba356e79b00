"""POST /v1/messages and /v1/messages/count_tokens (Anthropic Messages API)"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from server.api.messages.mcp import serve_messages_mcp
from server.api.messages.protocol import CountTokensRequest, MessagesRequest
from server.api.messages.serving import count_tokens, serve_messages
from server.http.deps import CallerDep, GatedRoute

router = APIRouter(route_class=GatedRoute)  # reads the body the model gate parsed


@router.post("/v1/messages")
async def create_message(body: MessagesRequest, request: Request, caller: CallerDep) -> Any:
    """Create a message (Anthropic's shapes; x-api-key or Bearer auth; the MCP connector)."""
    if body.has_mcp:
        return await serve_messages_mcp(body, request, caller)
    return await serve_messages(body, request, caller)


@router.post("/v1/messages/count_tokens")
async def count_message_tokens(body: CountTokensRequest, request: Request) -> Any:
    """The number of input tokens the same /v1/messages request would have."""
    return await count_tokens(body, request)
