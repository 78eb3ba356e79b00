"""POST /v1/completions"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from server.api.completions.protocol import CompletionRequest
from server.api.completions.serving import serve_completion
from server.http.deps import CallerDep, GatedRoute

router = APIRouter(route_class=GatedRoute)  # reads the body the model gate parsed


@router.post("/v1/completions")
async def create_completion(body: CompletionRequest, request: Request, caller: CallerDep) -> Any:
    """Create a completion for the given prompt(s)."""
    return await serve_completion(body, request, caller)
