"""POST /v1/completions"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request

from server.api.completions.protocol import CompletionRequest
from server.api.completions.serving import serve_completion
from server.http.deps import CallerDep
from server.http.lease import Lease, leased

router = APIRouter()


@router.post("/v1/completions")
async def create_completion(
    request: Request,
    caller: CallerDep,
    lease: Annotated[Lease[CompletionRequest], leased(CompletionRequest, notices=True)],
) -> Any:
    """Create a completion for the given prompt(s)."""
    return await lease.respond(lambda: serve_completion(lease.body, request, caller))
