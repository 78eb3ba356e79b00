"""POST /v1/responses, GET and DELETE /v1/responses/{id} (OpenAI Responses API)"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request

from server.api.responses.mcp import serve_mcp_response
from server.api.responses.protocol import ResponsesRequest
from server.api.responses.serving import delete_response, get_response, serve_response
from server.http.deps import CallerDep
from server.http.lease import Lease, leased

router = APIRouter()


@router.post("/v1/responses")
async def create_response(
    request: Request,
    caller: CallerDep,
    lease: Annotated[Lease[ResponsesRequest], leased(ResponsesRequest, notices=True)],
) -> Any:
    """Create a model response (text, function calls, MCP tools run by the server),
    optionally continuing a stored one."""
    body = lease.body
    if body.has_mcp:
        return await lease.respond(lambda: serve_mcp_response(body, request, caller))
    return await lease.respond(lambda: serve_response(body, request, caller))


@router.get("/v1/responses/{response_id}")
async def retrieve_response(response_id: str, request: Request, caller: CallerDep) -> Any:
    """A stored response of this API key."""
    return await get_response(request, caller, response_id)


@router.delete("/v1/responses/{response_id}")
async def remove_response(response_id: str, request: Request, caller: CallerDep) -> Any:
    """Delete a stored response of this API key."""
    return await delete_response(request, caller, response_id)
