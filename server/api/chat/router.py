"""POST /v1/chat/completions"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request, Response

from server.api.chat.mcp import serve_chat_mcp
from server.api.chat.protocol import ChatCompletionRequest
from server.api.chat.serving import serve_chat
from server.api.chat.template import router as template_router
from server.http.deps import CallerDep
from server.http.lease import Lease, leased

router = APIRouter()


@router.post("/v1/chat/completions")
async def create_chat_completion(
    request: Request,
    response: Response,
    caller: CallerDep,
    lease: Annotated[Lease[ChatCompletionRequest], leased(ChatCompletionRequest, notices=True)],
) -> Any:
    """Create a model response for the given chat conversation."""
    body = lease.body
    if body.has_mcp:  # kvserve's extension: MCP tools run by the server
        return await lease.respond(lambda: serve_chat_mcp(body, request, caller))
    return await lease.respond(lambda: serve_chat(body, request, response, caller))


router.include_router(template_router)  # POST /apply-template: the prompt only
