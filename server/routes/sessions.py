"""Sticky sessions: /v1/sessions, /v1/sessions/{id}, /v1/sessions/{id}/fork."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import Field

from engine.sessions import Session
from engine.types import SessionNotFoundError
from server.deps import CallerDep, EngineLike, ready_engine, registry, resolve_engine
from server.errors import from_engine_error
from server.protocol import _Open

router = APIRouter()

SessionId = Annotated[str, Field(min_length=1, max_length=128)]
Ttl = Annotated[float, Field(gt=0)]


class SessionFork(_Open):
    id: SessionId | None = None  # minted when absent
    ttl_s: Ttl | None = None  # idle seconds before it expires; the server default if absent


class SessionCreate(SessionFork):
    model: str | None = None  # the first served model when absent


def session_object(engine: EngineLike, session: Session) -> dict[str, Any]:
    return {
        "id": session.id,
        "object": "session",
        "model": engine.info.model_id,
        "created": int(session.created),
        "last_used": int(session.last_used),
        "expires_at": int(session.expires_at),
        "ttl_s": session.ttl_s,
        "tokens": session.num_tokens,
        "resident": engine.session_slot(session.key) is not None,
        "in_flight": session.in_flight,
    }


def _find(request: Request, tenant: str, session_id: str) -> tuple[EngineLike, Session]:
    """The engine holding the caller's session, whichever model it belongs to."""
    for served in registry(request):
        engine = ready_engine(served.engine)
        try:
            return engine, engine.get_session(tenant, session_id)
        except SessionNotFoundError:
            continue
    raise from_engine_error(SessionNotFoundError(session_id))


@router.post("/v1/sessions")
async def create_session(
    request: Request, caller: CallerDep, body: SessionCreate | None = None
) -> dict[str, Any]:
    """Open a sticky session (requests name it in `session_id` or `X-Session-Id`)."""
    body = body or SessionCreate()
    engine = resolve_engine(request, body.model or registry(request).default.id)
    try:
        session = engine.create_session(caller.tenant, body.id, body.ttl_s)
    except Exception as exc:
        raise from_engine_error(exc) from exc
    return session_object(engine, session)


@router.get("/v1/sessions")
async def list_sessions(request: Request, caller: CallerDep) -> dict[str, Any]:
    """The caller's sessions, on every model."""
    engines = [ready_engine(m.engine) for m in registry(request)]
    return {
        "object": "list",
        "data": [session_object(e, s) for e in engines for s in e.list_sessions(caller.tenant)],
    }


@router.get("/v1/sessions/{session_id}")
async def get_session(session_id: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    """One session: tokens it holds, whether its slot is still pinned, last use."""
    engine, session = _find(request, caller.tenant, session_id)
    return session_object(engine, session)


@router.post("/v1/sessions/{session_id}/fork")
async def fork_session(
    session_id: str, request: Request, caller: CallerDep, body: SessionFork | None = None
) -> dict[str, Any]:
    """A new session starting from a copy of this one's KV (the source is unchanged)."""
    body = body or SessionFork()
    engine, _ = _find(request, caller.tenant, session_id)
    try:
        session = await engine.fork_session(caller.tenant, session_id, body.id, body.ttl_s)
    except Exception as exc:
        raise from_engine_error(exc) from exc
    return session_object(engine, session)


@router.delete("/v1/sessions/{session_id}")
async def delete_session(session_id: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    """End a session and release its slot."""
    engine, _ = _find(request, caller.tenant, session_id)
    try:
        session = engine.delete_session(caller.tenant, session_id)
    except Exception as exc:
        raise from_engine_error(exc) from exc
    return {"id": session.id, "object": "session.deleted", "deleted": True}
