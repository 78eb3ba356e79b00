"""POST /v1/completions"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from server.apis.completions import serve_completion
from server.deps import CallerDep
from server.protocol import CompletionRequest

router = APIRouter()


@router.post("/v1/completions")
async def create_completion(body: CompletionRequest, request: Request, caller: CallerDep) -> Any:
    """Create a completion for the given prompt(s)."""
    return await serve_completion(body, request, caller)
