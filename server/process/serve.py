"""`kvserve` serving: the app under uvicorn, one worker, until a signal stops it (the
CLI calls `serve`; server/process/graceful.py is what a signal does)."""

from __future__ import annotations

import logging

import uvicorn
from fastapi import FastAPI

from server.app import create_app
from server.config.tree import Settings
from server.http.drain import ABORT_WAIT_S
from server.process.connections import connection_limit, protocol_class
from server.process.graceful import GracefulServer

log = logging.getLogger("kvserve.server")


def serve(settings: Settings) -> int:
    """Run kvserve until a signal stops it; the exit status."""
    app = create_app(settings)
    config = uvicorn_config(app, settings)
    GracefulServer(config, app.state.lifecycle, settings.server.shutdown_grace_s).run()
    return int(app.state.exit_code)  # 2: a model could not be fetched at start


def uvicorn_config(app: FastAPI, settings: Settings) -> uvicorn.Config:
    """uvicorn's settings for `app`: one worker, our logging, our connection bounds."""
    server = settings.server
    max_connections = connection_limit(server.max_connections)
    log.info("accepting up to %d connections", max_connections)
    return uvicorn.Config(
        app,
        host=server.host,
        port=server.port,
        workers=1,  # the engine lives in this process: scale with replicas, not workers
        log_config=None,  # our logging set-up (text or JSON) applies to uvicorn's lines too
        log_level=settings.logging.level,
        access_log=False,  # kvserve writes its own access lines (server.telemetry.access)
        timeout_graceful_shutdown=int(ABORT_WAIT_S),  # a backstop: the drain came first
        http=protocol_class(max_connections, server.header_timeout_s),
        timeout_keep_alive=max(1, round(server.keep_alive_s)),
    )
