"""POST /v1/chat/completions"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from server.apis.chat import serve_chat
from server.deps import CallerDep
from server.protocol import ChatCompletionRequest

router = APIRouter()


@router.post("/v1/chat/completions")
async def create_chat_completion(
    body: ChatCompletionRequest, request: Request, response: Response, caller: CallerDep
) -> Any:
    """Create a model response for the given chat conversation."""
    return await serve_chat(body, request, response, caller)
