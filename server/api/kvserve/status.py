"""GET /v1/status: the server's state in one JSON object, for the page at `/` and scripts.

Per model: its load state, slots, queue, sessions, prefix cache per tier and the recent
traffic (server/telemetry/recent.py). Gathered from what the engine and the cache report
(`EngineStats`, `CacheStats`, the session registry), not from /metrics.

Scoped as /v1/cache and /v1/sessions are: an admin key (or anyone, without keys) sees
the whole server; any other key sees its own sessions, its own share of the cache, its
own traffic, and of the slots only whether they are busy (/metrics says as much), with
the session and tokens of its own sessions' slots alone.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Request

from engine.client import CacheStats, EngineState, EngineStats, Session, TierStats
from server.api.kvserve.cache import _tenant_object
from server.api.kvserve.models import _STATES
from server.api.kvserve.sessions import session_object
from server.errors import BadRequest
from server.http.deps import Caller, CallerDep, registry, resolve_model
from server.models.served import ServedModel, family_of
from server.telemetry.recent import BUCKET_S

router = APIRouter()

MAX_SESSIONS = 50  # listed per model, most recently used first (`sessions_total`: all)


def _model_state(served: ServedModel) -> dict[str, Any]:
    engine = served.engine
    out: dict[str, Any] = {
        "id": served.id,
        "aliases": list(served.aliases),
        "state": _STATES[engine.state],
        "load": "on_demand" if served.on_demand else "startup",
    }
    if engine.state is EngineState.LOADING:
        out["load_phase"] = engine.load_phase  # loading, or downloading from the hub
        out["load_progress"] = round(engine.load_progress, 4)
    if engine.state is EngineState.FAILED:
        out["error"] = engine.load_error
    if engine.ready:
        out["n_ctx"] = engine.info.n_ctx
        out["family"] = family_of(engine.info)
    return out


def _slots(stats: EngineStats, caller: Caller) -> list[dict[str, Any]]:
    out = []
    for view in stats.slots:
        tenant, _, session_id = (view.session or "").partition("/")
        mine = caller.admin or (view.session is not None and tenant == caller.tenant)
        slot: dict[str, Any] = {
            "index": view.index,
            "busy": view.busy,
            "session": session_id if mine and view.session else None,
            "tokens": view.tokens if mine else None,
        }
        if caller.admin and view.session:
            slot["key"] = tenant  # the owner's key digest, as sessions are stored
        out.append(slot)
    return out


def _sessions(served: ServedModel, caller: Caller) -> tuple[list[dict[str, Any]], int]:
    engine = served.engine
    found: list[Session] = (
        engine.all_sessions() if caller.admin else engine.list_sessions(caller.tenant)
    )
    found.sort(key=lambda s: s.last_used, reverse=True)
    listed = []
    for session in found[:MAX_SESSIONS]:
        body = session_object(served, session)
        if caller.admin:
            body["key"] = session.tenant
        listed.append(body)
    return listed, len(found)


def _tier(stats: TierStats) -> dict[str, Any]:
    lookups = stats.hits + stats.misses
    return {
        "entries": stats.entries,
        "bytes": stats.bytes,
        "hits": stats.hits,
        "misses": stats.misses,
        "hit_rate": round(stats.hits / lookups, 4) if lookups else None,
        "evictions": stats.evictions,
        "errors": stats.errors,
    }


def _server_cache(cache: CacheStats | None, stats: EngineStats | None) -> dict[str, Any]:
    out: dict[str, Any] = {"enabled": cache is not None, "scope": "server"}
    if cache is not None:
        out["tiers"] = {name: _tier(tier) for name, tier in cache.tiers.items()}
        out["saves"] = cache.saves
        out["saves_dropped"] = cache.saves_dropped
    if stats is not None:
        out["requests"] = dict(stats.hits)
        out["requests_cold_why"] = dict(stats.cold_reasons)  # found a prefix, reused none
        out["reused_tokens"] = stats.num_reused_tokens
    return out


def _tenant_cache(served: ServedModel, caller: Caller) -> dict[str, Any]:
    body = _tenant_object(served, caller)
    del body["object"], body["model"]
    return body


def model_status(request: Request, served: ServedModel, caller: Caller) -> dict[str, Any]:
    engine = served.engine
    stats = engine.stats()  # None while not loaded
    out = _model_state(served)
    if stats is not None:
        out["slots"] = _slots(stats, caller)
        out["slots_total"] = stats.num_slots
        out["slots_busy"] = stats.num_running
        out["queue"] = stats.num_waiting
    else:
        out |= {"slots": [], "slots_total": 0, "slots_busy": 0, "queue": 0}
    out["sessions"], out["sessions_total"] = _sessions(served, caller)
    if caller.admin:
        out["cache"] = _server_cache(engine.cache_stats(), stats)
    else:
        out["cache"] = _tenant_cache(served, caller)
    recent = request.app.state.metrics.recent
    out["recent"] = {
        "bucket_s": BUCKET_S,
        "samples": recent.samples(served.id, None if caller.admin else caller.tenant),
    }
    return out


@router.get("/v1/status")
async def status(request: Request, caller: CallerDep) -> dict[str, Any]:
    """The server's state: per model its load state, slots, queue, sessions, cache tiers
    and recent traffic (an admin key: the whole server; any other: its own share).
    `?model=` keeps one model (by id or alias)."""
    unknown = sorted(set(request.query_params) - {"model"})
    if unknown:
        raise BadRequest(f"unknown query parameter '{unknown[0]}'", param=unknown[0])
    name = request.query_params.get("model")
    if name is not None:
        models = [resolve_model(request, name, require_ready=False)]
    else:
        models = list(registry(request))
    for served in models:  # reads the disk tier's directory the first time: off the loop
        await asyncio.to_thread(served.engine.open_cache)
    started = request.app.state.started
    return {
        "object": "status",
        "scope": "server" if caller.admin else "api_key",
        "time": round(time.time(), 3),
        "started": started,
        "uptime_s": int(time.time()) - started,
        "models": [model_status(request, m, caller) for m in models],
    }
