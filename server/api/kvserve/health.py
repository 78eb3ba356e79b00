"""GET /health (readiness), GET /livez (liveness). Both public."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from engine.client import EngineState
from server.http.deps import EngineLike

router = APIRouter()
_SETTLED = (EngineState.READY, EngineState.UNLOADED)


def _model_state(engine: EngineLike) -> dict[str, Any]:
    if engine.ready:
        return {"status": "ready"}
    if engine.state is EngineState.FAILED:
        return {"status": "error", "error": engine.load_error}
    if engine.state is EngineState.STOPPED:
        return {"status": "stopped"}
    if engine.state is EngineState.RECOVERING:  # its thread died; being rebuilt
        return {"status": "recovering"}
    if engine.state is EngineState.UNLOADED:  # loaded on demand: fine for readiness
        return {"status": "unloaded"}
    state: dict[str, Any] = {"status": "loading", "progress": round(engine.load_progress, 3)}
    if engine.load_phase == "downloading":  # a hub fetch: progress is the download's
        state["phase"] = "downloading"
    return state


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """200 when every model is loaded and serving; 503 while loading, failed or draining.

    `models` has each model's state; a loading server also says its overall progress."""
    served = request.app.state.models
    models = {m.id: _model_state(m.engine) for m in served}
    states = {m["status"] for m in models.values()}
    if request.app.state.lifecycle.draining:
        return JSONResponse({"status": "draining", "models": models}, status_code=503)
    if states <= {"ready", "unloaded"}:
        return JSONResponse({"status": "ok", "models": models})
    if "error" in states:
        body: dict[str, Any] = {"status": "error", "models": models}
        return JSONResponse(body, status_code=503)
    if "recovering" in states:
        return JSONResponse(
            {"status": "recovering", "models": models},
            status_code=503,
            headers={"Retry-After": "1"},
        )
    if "stopped" in states:
        return JSONResponse({"status": "stopped", "models": models}, status_code=503)
    progress = sum(
        1.0 if m.engine.state in _SETTLED else m.engine.load_progress for m in served
    ) / len(models)
    return JSONResponse(
        {"status": "loading", "progress": round(progress, 3), "models": models},
        status_code=503,
        headers={"Retry-After": "1"},
    )


@router.get("/livez")
async def livez() -> dict[str, str]:
    """Answers as long as the process runs."""
    return {"status": "alive"}
