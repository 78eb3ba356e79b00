"""POST /v1/chat/completions"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from server.apis.chat import serve_chat
from server.apis.chat_mcp import chat_has_mcp, serve_chat_mcp
from server.deps import CallerDep
from server.protocol import ChatCompletionRequest

router = APIRouter()


@router.post("/v1/chat/completions")
async def create_chat_completion(
    body: ChatCompletionRequest, request: Request, response: Response, caller: CallerDep
) -> Any:
    """Create a model response for the given chat conversation."""
    if chat_has_mcp(body):  # kvserve's extension: MCP tools run by the server
        return await serve_chat_mcp(body, request, caller)
    return await serve_chat(body, request, response, caller)
