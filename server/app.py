"""The FastAPI application: routers, error handlers, middleware, engines' lifecycle."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI
from fastapi.middleware.cors import CORSMiddleware

from engine.engine import CacheConfig, Engine, EngineConfig, SessionLimits
from engine.types import EngineNotReadyError
from server import errors
from server.config import ModelSection, Settings, chat_template_source
from server.deps import EngineLike, require_api_key
from server.lifecycle import Lifecycle
from server.metrics import make_registry
from server.metrics import router as metrics_router
from server.middleware import AccessMiddleware, BodyLimit
from server.registry import ModelRegistry, ServedModel
from server.routes import cache, chat, completions, embeddings, health, models, sessions, tokenize

log = logging.getLogger("kvserve.server")


def engine_config(model: ModelSection, settings: Settings | None = None) -> EngineConfig:
    e = model.engine
    settings = settings or Settings()
    c, sessions = settings.cache, settings.sessions
    cache = None
    if c.enabled:
        cache = CacheConfig(
            block_tokens=c.block_tokens,
            ram_bytes=c.ram_bytes,
            disk_dir=c.disk_dir,
            disk_bytes=c.disk_bytes,
            writer_queue=c.writer_queue,
            min_tokens=c.min_tokens,
        )
    return EngineConfig(
        model_path=model.model_path,
        model_id=model.id,
        n_ctx=e.n_ctx,
        n_seq_max=e.n_seq_max,
        kv_unified=e.kv_unified,
        n_batch=e.n_batch,
        prefill_chunk=e.prefill_chunk,
        n_threads=e.n_threads,
        max_queue=e.max_queue,
        embeddings=e.embeddings,
        embed_n_ctx=e.embed_n_ctx,
        embed_chunk=e.embed_chunk,
        exact_reuse=e.exact_reuse,
        speculative=e.speculative,
        flash_attn=e.flash_attn,
        type_k=e.type_k,
        type_v=e.type_v,
        n_ubatch=e.n_ubatch,
        n_gpu_layers=e.n_gpu_layers,
        extra_bufts=None if e.extra_bufts == "auto" else e.extra_bufts == "on",
        cache=cache,
        sessions=SessionLimits(sessions.default_ttl_s, sessions.max_ttl_s, sessions.max_sessions),
    )


def _served_models(
    settings: Settings, engine: EngineLike | None, engines: Mapping[str, EngineLike] | None
) -> ModelRegistry:
    configured = {m.id: m for m in settings.models}
    if engine is not None:  # a test seam: one ready-made engine, under its own id
        try:
            engines = {engine.info.model_id: engine}
        except EngineNotReadyError:
            engines = {settings.models[0].id: engine}
    if engines is None:
        engines = {m.id: Engine(engine_config(m, settings)) for m in settings.models}
    served = []
    for model_id, the_engine in engines.items():
        cfg = configured.get(model_id, ModelSection(id=model_id))
        served.append(ServedModel(model_id, cfg.aliases, the_engine, chat_template_source(cfg)))
    return ModelRegistry(served)


def create_app(
    settings: Settings,
    engine: EngineLike | None = None,
    *,
    engines: Mapping[str, EngineLike] | None = None,
) -> FastAPI:
    """Build the app. Without `engine`/`engines` (model id -> engine), one real engine
    per configured model is made; each loads in the background once the app starts
    (/health says 503 until all are ready)."""
    served = _served_models(settings, engine, engines)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        for model in served:
            model.engine.start()
        try:
            yield
        finally:
            for model in served:  # each engine saves what it keeps (cache, sessions) here
                try:
                    model.engine.close()
                except Exception:
                    log.exception("closing the engine of %s failed", model.id)

    app = FastAPI(
        title="kvserve",
        summary="OpenAI-compatible inference server on llama.cpp",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.models = served
    app.state.started = int(time.time())
    app.state.lifecycle = Lifecycle()
    app.state.registry, app.state.metrics = make_registry(served)
    errors.install(app)

    authed = [Depends(require_api_key)]
    app.include_router(health.router)
    if settings.metrics.enabled:
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
    app.add_middleware(  # outermost: sees every answer, 413s and CORS included
        AccessMiddleware,
        lifecycle=app.state.lifecycle,
        metrics=app.state.metrics,
        log_lines=settings.logging.access_log,
    )
    return app
