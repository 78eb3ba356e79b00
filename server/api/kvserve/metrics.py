"""GET /metrics: Prometheus's text format of this server's registry (made in
server/telemetry/metrics.py), open like /health, or off with `[metrics] enabled = false`."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

router = APIRouter()


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus metrics of this server."""
    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)
