"""Models loaded on demand, unloaded when idle or when the memory budget is exceeded.

A model with `load = "on_demand"` is not loaded at start; the first request naming it
loads it and waits (up to `loading.wait_s`, then 503 with Retry-After). A model with
`idle_unload_s` (or a request's keep_alive, Ollama's API) is unloaded after that long
without requests. With
`loading.memory_budget_bytes`, loading a model first unloads the least recently used
idle models until its weights and KV fit. Unloading saves what the slots hold to the
prefix cache, which the engine keeps (as it keeps its sessions): a reloaded model, and a
session on it, resume warm.

A model that is loading is neither unloaded nor deleted: both answer 409
`model_loading` (retry once it has loaded) rather than wait for a download of any
length, or leave the load to finish into an engine that nobody serves. A delete holds
the model's lock from its checks to its engine's close, so a request arriving meanwhile
cannot start a load on it: that request gets the 404 of a model no longer served.

Thread contract: everything here runs on the event loop; `Engine.unload` blocks, so it
runs in a worker thread under the model's lock, which loads take too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram

from engine.client import EngineState
from server.errors import BadRequest, Conflict, NotFound, ServiceUnavailable

if TYPE_CHECKING:
    from server.config.tree import LoadingSection
    from server.models.served import ModelRegistry, ServedModel

log = logging.getLogger("kvserve.server")

_POLL_S = 0.1
# A failed load is tried again by the first request this long after it failed (the
# Retry-After its 503 names); a load by hand tries at once.
RETRY_FAILED_S = 10.0
# Becoming ready by themselves: a load, or the rebuild of a dead engine thread (quick).
_COMING = (EngineState.LOADING, EngineState.RECOVERING)
_LOAD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class ModelLoader:
    def __init__(self, models: ModelRegistry, config: LoadingSection, registry: CollectorRegistry):
        self.models = models
        self.config = config
        self.loads = Counter("kvserve_model_loads", "Model loads.", ["model"], registry=registry)
        self.unloads = Counter(
            "kvserve_model_unloads",
            "Model unloads (idle, budget or by hand).",
            ["model"],
            registry=registry,
        )
        self.load_seconds = Histogram(
            "kvserve_model_load_seconds",
            "How long a model load took (download included).",
            ["model"],
            buckets=_LOAD_BUCKETS,
            registry=registry,
        )
        self._locks = {m.id: asyncio.Lock() for m in models}
        self._seen = {m.id: m.engine.state for m in models}
        self._failed_at: dict[str, float] = {}  # model -> when its last load failed

    def _lock(self, served: ServedModel) -> asyncio.Lock:
        # setdefault: a model pulled at run time (server/models/hub_models.py) gets its own too
        return self._locks.setdefault(served.id, asyncio.Lock())

    # -- what requests call ------------------------------------------------------------

    async def ensure_loaded(self, served: ServedModel, *, retry_now: bool = False) -> None:
        """Return once `served` is ready; load it first if need be. 503 (Retry-After)
        when the load fails or takes longer than `wait_s`. A load that failed less than
        RETRY_FAILED_S ago is not tried again (unless `retry_now`: a load by hand)."""
        if served.engine.ready:
            return
        await self.load(served, retry_now=retry_now)
        engine = served.engine
        deadline = time.monotonic() + self.config.wait_s
        while engine.state in _COMING and time.monotonic() < deadline:
            await asyncio.sleep(_POLL_S)
        self._observe()
        if engine.ready:
            return
        if engine.state is EngineState.FAILED and engine.load_refused:
            raise BadRequest(
                engine.load_error or f"the model '{served.id}' cannot be served",
                param="model",
                code="model_not_supported",
            )
        if engine.state is EngineState.FAILED:
            raise ServiceUnavailable(
                f"the model '{served.id}' failed to load: {engine.load_error}",
                code="model_load_failed",
                headers={"Retry-After": f"{RETRY_FAILED_S:.0f}"},
            )
        raise ServiceUnavailable(
            f"the model '{served.id}' is still loading ({engine.load_progress:.0%})",
            code="model_loading",
            headers={"Retry-After": "5"},
        )

    async def load(self, served: ServedModel, *, retry_now: bool = False) -> None:
        """Start loading `served` (unloading idle models first to keep within the budget);
        returns without waiting for the load. 404 if it was deleted meanwhile."""
        async with self._lock(served):
            if self.models.get(served.id) is not served:  # retired while this waited
                raise NotFound(f"the model '{served.id}' was deleted", param="model",
                               code="model_not_found")  # fmt: skip
            engine = served.engine
            if engine.ready or engine.state in _COMING:
                return
            failed_at = self._failed_at.get(served.id)
            if not retry_now and failed_at and time.monotonic() - failed_at < RETRY_FAILED_S:
                return  # each attempt reads the whole file: not one per request
            self._failed_at.pop(served.id, None)
            await self._make_room(served)
            log.info("loading model %s", served.id)
            engine.start()
            self._seen[served.id] = EngineState.LOADING

    async def unload(self, served: ServedModel, *, own: int = 0) -> bool:
        """Unload `served` if it is loaded and idle; False if it was not. `own`: the
        requests in flight that are the caller's (a request that unloads its own model
        counts itself). 409 while it loads."""
        async with self._lock(served):
            return await self._unload_locked(served, own)

    async def _unload_locked(self, served: ServedModel, own: int = 0) -> bool:
        engine = served.engine
        _refuse_while_loading(served, "unloaded")
        if not engine.ready or served.in_flight > own or engine.busy:
            return False
        log.info("unloading model %s", served.id)
        self._observe()  # counted as loaded before the state changes
        if not engine.unload():
            return False
        if served.keep_alive_s == 0:  # the unload a keep_alive of 0 asked for: done,
            served.keep_alive_s = None  # the next load stays as configured
        self._seen[served.id] = EngineState.READY
        done = await asyncio.to_thread(engine.wait_stopped)
        self._observe()
        return done

    async def retire(self, served: ServedModel, drop: Callable[[], None]) -> None:
        """Stop serving `served` for good (a delete): unload it, `drop` it from the
        registry, close its engine, all under its lock (a request that arrives meanwhile
        waits for the lock, then finds it gone). 409 while it loads or serves."""
        async with self._lock(served):
            _refuse_while_loading(served, "deleted")
            busy = served.in_flight or served.engine.busy
            if busy or (served.engine.ready and not await self._unload_locked(served)):
                raise Conflict(f"the model '{served.id}' has requests in flight",
                               param="model", code="model_busy")  # fmt: skip
            drop()
            await asyncio.to_thread(served.engine.close)  # drains its cache's writes
        self.forget(served)

    def forget(self, served: ServedModel) -> None:
        """`served` is no longer served (deleted): its bookkeeping goes with it."""
        for table in (self._locks, self._seen, self._failed_at):
            table.pop(served.id, None)  # type: ignore[attr-defined]

    # -- policy ------------------------------------------------------------------------

    async def _make_room(self, loading: ServedModel) -> None:
        budget = self.config.memory_budget_bytes
        if not budget:
            return
        need = loading.engine.memory_bytes
        while True:
            loaded = [m for m in self.models if m is not loading and self._holds_memory(m)]
            if sum(m.engine.memory_bytes for m in loaded) + need <= budget:
                return
            idle = [m for m in loaded if m.engine.ready and not m.in_flight and not m.engine.busy]
            if not idle:
                raise ServiceUnavailable(
                    f"the model '{loading.id}' does not fit the memory budget beside the "
                    "models in use; retry when they are idle",
                    code="memory_budget",
                    headers={"Retry-After": "5"},
                )
            victim = min(idle, key=lambda m: m.last_used)
            log.info("memory budget: unloading %s to load %s", victim.id, loading.id)
            async with self._lock(victim):
                self._observe()
                if victim.engine.unload():
                    self._seen[victim.id] = EngineState.READY
                    await asyncio.to_thread(victim.engine.wait_stopped)
            self._observe()

    @staticmethod
    def _holds_memory(served: ServedModel) -> bool:
        return served.engine.state in (EngineState.READY, *_COMING)

    async def run(self) -> None:
        """Background task: idle unloads, and the load/unload metrics."""
        while True:
            await asyncio.sleep(_POLL_S * 5)
            self._observe()
            now = time.monotonic()
            for served in self.models:
                limit = served.unload_after_s
                if limit is not None and served.engine.ready and now - served.last_used >= limit:
                    with contextlib.suppress(Exception):
                        await self.unload(served)

    def _observe(self) -> None:
        """Count the state changes since last time (startup loads included)."""
        for served in self.models:
            state = served.engine.state
            before = self._seen.setdefault(served.id, state)  # a model added at run time
            if state is before:
                continue
            if state is EngineState.READY:
                self.loads.labels(served.id).inc()
                self.load_seconds.labels(served.id).observe(served.engine.load_seconds)
            elif state is EngineState.UNLOADED and before is EngineState.READY:
                self.unloads.labels(served.id).inc()
            elif state is EngineState.FAILED:
                self._failed_at[served.id] = time.monotonic()
            self._seen[served.id] = state


def _refuse_while_loading(served: ServedModel, what: str) -> None:
    if served.engine.state is EngineState.LOADING:
        raise Conflict(
            f"the model '{served.id}' is loading and cannot be {what} now; retry once "
            "it has loaded",
            param="model",
            code="model_loading",
            headers={"Retry-After": "5"},
        )
