"""Sticky sessions: /v1/sessions, /v1/sessions/{id}, /v1/sessions/{id}/fork.

Sessions outlive their model's unload (the engine keeps them), so every route here but
fork works whatever state the model is in; a fork needs the copy done by a loaded
engine, and loads the model as a generation request would.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import Field

from engine.client import Session, SessionNotFoundError
from server.api.common import RequestModel
from server.http.deps import CallerDep, registry, resolve_model
from server.models.served import ServedModel

router = APIRouter()

SessionId = Annotated[str, Field(min_length=1, max_length=128)]
Ttl = Annotated[float, Field(gt=0)]


class SessionFork(RequestModel):
    id: SessionId | None = None  # minted when absent
    ttl_s: Ttl | None = None  # idle seconds before it expires; the server default if absent


class SessionCreate(SessionFork):
    model: str | None = None  # the first served model when absent


def session_object(served: ServedModel, session: Session) -> dict[str, Any]:
    engine = served.engine
    return {
        "id": session.id,
        "object": "session",
        "model": served.id,
        "created": int(session.created),
        "last_used": int(session.last_used),
        "expires_at": int(session.expires_at),
        "ttl_s": session.ttl_s,
        "tokens": session.num_tokens,
        "resident": engine.session_slot(session.key) is not None,
        "in_flight": session.in_flight,
    }


def _find(request: Request, tenant: str, session_id: str) -> tuple[ServedModel, Session]:
    """The model holding the caller's session, whichever it is, loaded or not."""
    for served in registry(request):
        try:
            return served, served.engine.get_session(tenant, session_id)
        except SessionNotFoundError:
            continue
    raise SessionNotFoundError(session_id)


@router.post("/v1/sessions")
async def create_session(
    request: Request, caller: CallerDep, body: SessionCreate | None = None
) -> dict[str, Any]:
    """Open a sticky session (requests name it in `session_id` or `X-Kvserve-Session`)."""
    body = body or SessionCreate()
    name = body.model or registry(request).default.id
    served = resolve_model(request, name, require_ready=False)  # a session needs no engine
    session = served.engine.create_session(caller.tenant, body.id, body.ttl_s)
    return session_object(served, session)


@router.get("/v1/sessions")
async def list_sessions(request: Request, caller: CallerDep) -> dict[str, Any]:
    """The caller's sessions, on every model, loaded or not."""
    data = [
        session_object(served, session)
        for served in registry(request)
        for session in served.engine.list_sessions(caller.tenant)
    ]
    return {"object": "list", "data": data}


@router.get("/v1/sessions/{session_id}")
async def get_session(session_id: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    """One session: tokens it holds, whether its slot is still pinned, last use."""
    served, session = _find(request, caller.tenant, session_id)
    return session_object(served, session)


@router.post("/v1/sessions/{session_id}/fork")
async def fork_session(
    session_id: str, request: Request, caller: CallerDep, body: SessionFork | None = None
) -> dict[str, Any]:
    """A new session starting from a copy of this one's KV (the source is unchanged)."""
    body = body or SessionFork()
    served, _ = _find(request, caller.tenant, session_id)
    served.in_flight += 1  # not unloaded before the copy is done (see server/models/loader.py)
    try:
        await request.app.state.loader.ensure_loaded(served)
        session = await served.engine.fork_session(caller.tenant, session_id, body.id, body.ttl_s)
    finally:
        served.in_flight -= 1
        served.last_used = time.monotonic()
    return session_object(served, session)


@router.delete("/v1/sessions/{session_id}")
async def delete_session(session_id: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    """End a session and release its slot."""
    served, _ = _find(request, caller.tenant, session_id)
    session = served.engine.delete_session(caller.tenant, session_id)
    return {"id": session.id, "object": "session.deleted", "deleted": True}
