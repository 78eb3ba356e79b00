"""The page at `/`: chat and live server state, as static files committed in static/
beside this module (no build step). It reads the same API as any client (`/v1/models`,
`/v1/chat/completions`, `/v1/status`) with the key the user types, so it needs no
authentication of its own and sees what that key may see.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).resolve().parent / "static"

# Only the page's own files, no inline script or style: model output that slipped into
# markup could still not run (the page builds the DOM with textContent anyway).
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

router = APIRouter()


@router.get("/", include_in_schema=False)
async def index() -> FileResponse:
    return FileResponse(
        STATIC / "index.html",
        headers={"Content-Security-Policy": _CSP, "Cache-Control": "no-cache"},
    )


def install(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
