"""GET /health (readiness), GET /livez (liveness). Both public."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from engine.engine import EngineState

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """200 when the model is loaded and the engine serves; 503 while loading or failed."""
    engine = request.app.state.engine
    if engine.ready:
        return JSONResponse({"status": "ok"})
    if engine.state is EngineState.FAILED:
        return JSONResponse({"status": "error", "error": engine.load_error}, status_code=503)
    if engine.state is EngineState.STOPPED:
        return JSONResponse({"status": "stopped"}, status_code=503)
    return JSONResponse(
        {"status": "loading", "progress": round(engine.load_progress, 3)},
        status_code=503,
        headers={"Retry-After": "1"},
    )


@router.get("/livez")
async def livez() -> dict[str, str]:
    """Answers as long as the process runs."""
    return {"status": "alive"}
