"""The FastAPI application: routers, error handlers, middleware, engines' lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from engine.client import (
    CacheBudget,
    Engine,
    EngineConfig,
    EngineNotReadyError,
    EngineState,
    LoraAdapter,
    SessionBusyError,
    SessionNotFoundError,
)
from server import errors
from server.api import chat, completions, embeddings, kvserve, messages, ollama, responses
from server.api.chat.template import render_chat
from server.api.responses.shared_store import RedisResponses
from server.api.responses.store import ResponseStore
from server.config.tree import (
    LoraSection,
    ModelSection,
    Settings,
    chat_template_source,
    hub_source,
    lora_source,
)
from server.http.apis import Apis
from server.http.bodies import BodyBudget, BodyLimit
from server.http.deps import EngineLike
from server.http.drain import Lifecycle
from server.http.key_first import KeyFirst
from server.http.middleware import AccessMiddleware, OriginGuard
from server.mcp.manager import McpManager
from server.models import hub
from server.models.hub_models import Configured, HubModels
from server.models.loader import ModelLoader
from server.models.pulls import Pulls
from server.models.served import ModelRegistry, ServedModel
from server.telemetry import tracing
from server.telemetry.metrics import make_registry

log = logging.getLogger("server")

# The APIs the server speaks, one spec per package under server/api/ (server/http/apis.py):
# adding an API is its package and one line here.
APIS = Apis([
    chat.API,
    completions.API,
    responses.API,
    messages.API,
    embeddings.API,
    kvserve.API,
    ollama.API,
])  # fmt: skip


def engine_config(
    model: ModelSection,
    settings: Settings | None = None,
    label: str = "model",
    budget: CacheBudget | None = None,
) -> EngineConfig:
    """The engine of `model`: its settings as configured, the cache and session limits
    of the process (`budget`: the process's one cache budget, shared by every model's
    cache), and how to fetch it (and its adapters) from a hub."""
    settings = settings or Settings()
    fetch = fetch_mmproj = None
    if model.hf_repo:
        source = hub_source(label, model, settings.hub)
        fetch = functools.partial(hub.fetch, source)
        if not model.mmproj:  # the repository's projector comes along, as with -hf
            fetch_mmproj = functools.partial(hub.fetch, source, projector=True)
    cache = settings.cache
    if cache.enabled and not cache.disk_path:
        log.info("cache: disk tier off (cache.disk_dir is empty): a restart starts cold")
    return EngineConfig.of(
        model.engine,
        model.model_path,
        model.id,
        cache=cache if cache.enabled else None,
        cache_budget=budget,
        sessions=settings.sessions,
        fetch=fetch,
        fetch_mmproj=fetch_mmproj,
        loras=tuple(
            _adapter(f"{label}.loras[{j}]", a, settings) for j, a in enumerate(model.loras)
        ),
        mmproj=model.mmproj,
    )


def _adapter(label: str, lora: LoraSection, settings: Settings) -> LoraAdapter:
    fetch = None
    if lora.hf_repo:
        fetch = functools.partial(hub.fetch, lora_source(label, lora, settings.hub))
    return LoraAdapter(lora.id, lora.path, lora.scale, fetch)


def _served_models(
    settings: Settings,
    engine: EngineLike | None,
    engines: Mapping[str, EngineLike] | None,
    budget: CacheBudget,
) -> ModelRegistry:
    configured = {m.id: m for m in settings.models}
    if engine is not None:  # a test seam: one ready-made engine, under its own id
        try:
            engines = {engine.info.model_id: engine}
        except EngineNotReadyError:
            engines = {settings.models[0].id: engine}
    if engines is None:
        labels = [f"models[{i}]" for i in range(len(settings.models))]
        if len(labels) == 1:
            labels = ["model"]
        engines = {
            m.id: Engine(engine_config(m, settings, label, budget))
            for m, label in zip(settings.models, labels, strict=True)
        }
    served = []
    for model_id, the_engine in engines.items():
        cfg = configured.get(model_id, ModelSection(id=model_id))
        model = ServedModel(
            model_id,
            cfg.aliases,
            the_engine,
            chat_template_source(cfg),
            context_overflow=cfg.context_overflow,
            loras=tuple((a.id, a.scale) for a in cfg.loras),
        )
        model.on_demand = cfg.load == "on_demand"
        model.idle_unload_s = cfg.idle_unload_s
        model.path = cfg.model_path
        model.last_used = time.monotonic()  # idle time counts from the start
        if model.on_demand:
            the_engine.state = EngineState.UNLOADED  # until a request needs it
        served.append(model)
    names = settings.model_names
    return ModelRegistry(served, names.patterns, any_with_one=names.any_with_one_model)


def _hub_models(
    settings: Settings,
    served: ModelRegistry,
    loader: ModelLoader,
    budget: CacheBudget,
    follow: bool,
) -> HubModels:
    """Pulled models: served with the [engine] defaults, loaded by their first request,
    their prefix caches within the process's one cache budget; `follow`: the list
    follows the hub cache (what other replicas pull and delete there)."""

    def make_engine(model_id: str, path: str) -> EngineLike:
        section = ModelSection(id=model_id, path=path, engine=settings.engine)
        return Engine(engine_config(section, settings, model_id, budget))

    configured = Configured.of(settings.models)  # never listed as pulled, never deleted
    return HubModels(served, loader, make_engine, settings.hub.cache_dir, configured,
                     follow=follow)  # fmt: skip


def _response_store(settings: Settings, served: ModelRegistry) -> ResponseStore:
    """Stored responses: in the Redis the replicas share when `[cache] shared_url` is
    set (a chain continues on any replica), else in this process."""
    r, c = settings.responses, settings.cache
    shared = None
    if c.shared_url:
        shared = RedisResponses(c.shared_url, max_per_key=r.max_stored, ttl_s=r.ttl_s,
                                timeout_s=c.shared_timeout_s, retry_s=c.shared_retry_s)  # fmt: skip

    def release(tenant: str, session_id: str) -> None:
        """A chain session no stored response names any more: ended on every model
        that holds it (busy: the turn running on it will be stored and name it)."""
        for model in served:
            with contextlib.suppress(SessionNotFoundError, SessionBusyError):
                model.engine.delete_session(tenant, session_id)

    return ResponseStore(r.max_stored, r.ttl_s, shared=shared, release=release)


async def _exit_if_start_fails(app: FastAPI, served: ModelRegistry) -> None:
    """A model that cannot be fetched from the hub at start, or is of a kind kvserve
    cannot serve (an encoder-decoder, a diffusion model), stops the process with status
    2, as a configuration error would (another failed load of a local file keeps serving
    and says so on /health, as before)."""
    at_start = [m for m in served if not m.on_demand]
    while any(m.engine.state is EngineState.LOADING for m in at_start):
        await asyncio.sleep(0.1)
    for model in at_start:
        engine = model.engine
        failed = engine.state is EngineState.FAILED
        if failed and (engine.load_phase == "downloading" or engine.load_refused):
            print(f"kvserve: {engine.load_error}", file=sys.stderr, flush=True)
            app.state.exit_code = 2
            os.kill(os.getpid(), signal.SIGTERM)  # the usual drain and shutdown
            return


def create_app(
    settings: Settings,
    engine: EngineLike | None = None,
    *,
    engines: Mapping[str, EngineLike] | None = None,
) -> FastAPI:
    """Build the app. Without `engine`/`engines` (model id -> engine), one real engine
    per configured model is made; each loads in the background once the app starts
    (/health says 503 until all are ready)."""
    # One RAM and one disk budget for every model's prefix cache, pulled ones included.
    budget = CacheBudget.of(settings.cache)
    served = _served_models(settings, engine, engines, budget)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tracing.start(settings.tracing)  # off: nothing (docs/operations.md "Tracing")
        for model in served:
            if not model.on_demand:
                model.engine.start()
        watcher = asyncio.create_task(_exit_if_start_fails(app, served))
        unloader = asyncio.create_task(app.state.loader.run())
        try:
            yield
        finally:
            watcher.cancel()
            unloader.cancel()
            app.state.pulls.close()
            app.state.responses.close()
            await app.state.mcp.close()
            for model in served:  # each engine saves what it keeps (cache, sessions) here
                try:
                    model.engine.close()
                except Exception:
                    log.exception("closing the engine of %s failed", model.id)
            tracing.shutdown()  # sends the spans still buffered

    app = FastAPI(
        title="kvserve",
        summary="OpenAI-compatible inference server on llama.cpp",
        version="0.1.0",
        lifespan=lifespan,
        # FastAPI's /docs, /redoc and /openapi.json are public: server/api/kvserve/docs.py's
        # take the API key when keys are configured.
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        # FastAPI's own OpenTelemetry (on whenever some code in the process sets a global
        # provider, or FASTAPI_OTEL_AUTO_CONFIGURE is set) stays off: kvserve's traces are
        # its own, from [tracing] (server/telemetry/tracing.py), and off means no spans at all.
        telemetry={"tracing": False, "metrics": False, "logs": False, "auto_configure": False},
    )
    app.state.settings = settings
    app.state.models = served
    app.state.started = int(time.time())
    app.state.exit_code = 0
    app.state.lifecycle = Lifecycle()
    app.state.responses = _response_store(settings, served)
    app.state.mcp = McpManager(settings.mcp, settings.mcp_servers)
    app.state.registry, app.state.metrics = make_registry(served)
    app.state.loader = ModelLoader(served, settings.loading, app.state.registry)
    app.state.cache_budget = budget
    # A real server follows the hub cache (and a test's app that names one): what it
    # holds at start, and what other replicas pull into it or delete from it later.
    follow = (engine is None and engines is None) or bool(settings.hub.cache_dir)
    app.state.hub_models = _hub_models(settings, served, app.state.loader, budget, follow)
    app.state.pulls = Pulls(settings.hub)
    app.state.render_chat = render_chat  # /tokenize's `messages` (an API imports no other)
    if follow:
        app.state.hub_models.discover()
    app.state.apis = APIS
    errors.install(app, APIS.error_shapes())

    # Every route takes the API key, checked once, before its body is read (KeyFirst,
    # below), but the open ones the APIs' mounts return.
    for spec in APIS.specs:
        for router in spec.routers:
            app.include_router(router)
    open_routes = [route for spec in APIS.specs if spec.mount for route in spec.mount(app)]

    app.add_middleware(
        BodyLimit,
        limit=settings.server.max_body_bytes,
        timeout_s=settings.server.body_timeout_s,
        budget=BodyBudget(settings.server.max_body_bytes_total),
    )
    # The key before the body: a request without one reads and parses nothing.
    app.add_middleware(KeyFirst, keys=settings.auth.all_keys, open_routes=open_routes)
    if settings.server.cors_origins:  # outside the refusals above: they carry its headers
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.server.cors_origins),
            allow_methods=["*"],
            allow_headers=["*"],
        )
    app.add_middleware(  # before the body is read: pages of other sites, DNS rebinding
        OriginGuard,
        cors_origins=settings.server.cors_origins,
        allowed_hosts=settings.server.allowed_hosts,
    )
    if settings.tracing.enabled:  # the server span; its trace id in the access line
        # Here, not at the top: it imports OpenTelemetry, the optional [tracing] extra.
        from server.telemetry.spans import TracingMiddleware

        app.add_middleware(TracingMiddleware)
    app.add_middleware(  # outermost: sees every answer, 413s and CORS included
        AccessMiddleware,
        lifecycle=app.state.lifecycle,
        metrics=app.state.metrics,
        log_lines=settings.logging.access_log,
    )
    return app
