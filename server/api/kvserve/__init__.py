"""The server's own routes: /health and /livez, /v1/status, /v1/models (and load, unload),
/v1/sessions, /v1/cache, /tokenize and /detokenize, /metrics, /openapi.json with /docs and
/redoc, and the page at `/` (its files in static/)."""

from collections.abc import Sequence

from fastapi import FastAPI
from starlette.routing import BaseRoute, Mount

from server.api.kvserve import (
    cache,
    docs,
    health,
    metrics,
    models,
    page,
    props,
    sessions,
    status,
    tokenize,
)
from server.http.apis import ApiSpec


def _mount(app: FastAPI) -> Sequence[BaseRoute]:
    """The routes open without a key (/health, /livez, /metrics when it is on, the page
    and its files), and /docs (which takes the key itself)."""
    open_routers = [health.router]
    if app.state.settings.metrics.enabled:
        open_routers.append(metrics.router)
    for router in open_routers:
        app.include_router(router)
    page.install(app)  # the page at / (its API calls carry the key)
    docs.install(app)
    routes = [route for router in (*open_routers, page.router) for route in router.routes]
    return [*routes, *(route for route in app.routes if isinstance(route, Mount))]


API = ApiSpec(
    "kvserve",
    routers=(
        models.router,
        tokenize.router,
        props.router,
        sessions.router,
        cache.router,
        status.router,
    ),
    mount=_mount,
)
