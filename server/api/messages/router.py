"""POST /v1/messages and /v1/messages/count_tokens (Anthropic Messages API)"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request

from server.api.messages.mcp import serve_messages_mcp
from server.api.messages.protocol import CountTokensRequest, MessagesRequest, log_beta_hints
from server.api.messages.serving import count_tokens, serve_messages
from server.http.deps import CallerDep
from server.http.lease import Lease, leased

router = APIRouter()


@router.post("/v1/messages")
async def create_message(
    request: Request,
    caller: CallerDep,
    lease: Annotated[Lease[MessagesRequest], leased(MessagesRequest, notices=True)],
) -> Any:
    """Create a message (Anthropic's shapes; x-api-key or Bearer auth; the MCP connector)."""
    body = lease.body
    log_beta_hints(request.headers.get("anthropic-beta", ""))
    if body.has_mcp:
        return await lease.respond(lambda: serve_messages_mcp(body, request, caller))
    return await lease.respond(lambda: serve_messages(body, request, caller))


@router.post("/v1/messages/count_tokens")
async def count_message_tokens(
    request: Request, lease: Annotated[Lease[CountTokensRequest], leased(CountTokensRequest)]
) -> Any:
    """The number of input tokens the same /v1/messages request would have."""
    log_beta_hints(request.headers.get("anthropic-beta", ""))
    return await count_tokens(lease.body, request)
