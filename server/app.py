"""The FastAPI application: routers, error handlers, middleware, engine lifecycle."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI
from fastapi.middleware.cors import CORSMiddleware

from engine.engine import Engine, EngineConfig
from server import errors
from server.config import Settings, chat_template_source
from server.deps import EngineLike, require_api_key
from server.metrics import make_registry
from server.metrics import router as metrics_router
from server.middleware import BodyLimit
from server.routes import cache, chat, completions, embeddings, health, models, sessions, tokenize

log = logging.getLogger("kvserve.server")


def engine_config(settings: Settings) -> EngineConfig:
    m = settings.model
    return EngineConfig(
        model_path=settings.model_path,
        model_id=m.id,
        n_ctx=m.n_ctx,
        n_seq_max=m.n_seq_max,
        kv_unified=m.kv_unified,
        n_batch=m.n_batch,
        prefill_chunk=m.prefill_chunk,
        n_threads=m.n_threads,
        max_queue=m.max_queue,
        embeddings=m.embeddings,
        embed_n_ctx=m.embed_n_ctx,
        embed_chunk=m.embed_chunk,
    )


def create_app(settings: Settings, engine: EngineLike | None = None) -> FastAPI:
    """Build the app. Without `engine`, a real one is made from `settings` and its model
    loads in the background once the app starts (/health says 503 until then)."""
    the_engine: EngineLike = engine if engine is not None else Engine(engine_config(settings))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        the_engine.start()
        try:
            yield
        finally:
            the_engine.close()

    app = FastAPI(
        title="kvserve",
        summary="OpenAI-compatible inference server on llama.cpp",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.engine = the_engine
    app.state.template_override = chat_template_source(settings)
    app.state.started = int(time.time())
    app.state.registry = make_registry(the_engine)
    errors.install(app)

    authed = [Depends(require_api_key)]
    app.include_router(health.router)
    app.include_router(metrics_router)
    for router in (
        chat.router,
        completions.router,
        embeddings.router,
        models.router,
        tokenize.router,
        sessions.router,
        cache.router,
    ):
        app.include_router(router, dependencies=authed)

    if settings.server.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.server.cors_origins),
            allow_methods=["*"],
            allow_headers=["*"],
        )
    app.add_middleware(BodyLimit, limit=settings.server.max_body_bytes)
    return app
