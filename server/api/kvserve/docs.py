"""GET /openapi.json, /docs (Swagger UI), /redoc: the API's description, behind the API
key when keys are configured (like every route but /health, /livez, /metrics and the
page's static files), open without keys. FastAPI's own copies are turned off
(server/app.py) because it serves them to anyone."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse

from server.http.deps import require_api_key

OPENAPI_URL = "/openapi.json"
router = APIRouter(dependencies=[Depends(require_api_key)])


@router.get(OPENAPI_URL, include_in_schema=False)
async def openapi(request: Request) -> dict[str, Any]:
    return request.app.openapi()  # type: ignore[no-any-return]


@router.get("/docs", include_in_schema=False)
async def swagger_ui(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(openapi_url=OPENAPI_URL, title=f"{request.app.title} - Swagger UI")


@router.get("/redoc", include_in_schema=False)
async def redoc(request: Request) -> HTMLResponse:
    return get_redoc_html(openapi_url=OPENAPI_URL, title=f"{request.app.title} - ReDoc")


def install(app: FastAPI) -> None:
    app.include_router(router)
