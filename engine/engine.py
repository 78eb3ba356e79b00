"""`Engine`: the asyncio-facing side of the engine thread.

The server talks only to this class (or to a fake with the same methods). It runs on
the event loop thread: requests are validated and their samplers built here, then handed
to the engine thread through its command queue; outputs come back through
`loop.call_soon_threadsafe`, once per engine step.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import cast

import numpy as np

from cache import CacheConfig, CacheHit, CacheStats, PrefixCache
from engine.detokenizer import IncrementalDetokenizer
from engine.embedder import EmbedJob
from engine.llama import Context, Model, Sampler
from engine.loading import EngineConfig, load, open_prefix_cache
from engine.recovery import abandon
from engine.scheduler import Scheduler
from engine.sequence import Sequence as Seq
from engine.sessions import Session, SessionLimits, SessionRegistry, pin_key
from engine.stats import StepCounters
from engine.types import (
    EngineNotReadyError,
    EngineRecoveringError,
    EngineStats,
    GenerateRequest,
    InvalidRequestError,
    ModelInfo,
    NoSlotError,
    QueueFullError,
    SeqOutput,
    SessionBusyError,
    TenantCacheView,
)
from engine.validation import validate
from engine.watchdog import Watchdog
from engine.worker import Abort, Embed, Fork, ReleaseSession, Stop, Submit, Worker

log = logging.getLogger("kvserve.engine")


# Re-exported: the server builds engines from these.
__all__ = ["CacheConfig", "Engine", "EngineConfig", "EngineState", "Generation", "SessionLimits"]


class EngineState(enum.StrEnum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    RECOVERING = "recovering"  # the engine thread died and is being rebuilt (503)
    STOPPED = "stopped"
    UNLOADED = "unloaded"  # model and context freed; the prefix cache and sessions kept


class Generation:
    """The outputs of one API request: `n` sequences of one prompt, interleaved.

    Iterate to receive `(index, SeqOutput)` until every sequence has finished. Leaving
    early (`async with` exit, or `abort()`) aborts the sequences still running.
    """

    def __init__(
        self,
        request_ids: Sequence[str],
        abort: Callable[[list[str]], None],
        session_id: str | None = None,
        session: Session | None = None,
        tenant: str = "",
    ):
        self.tenant = tenant
        self.request_ids = list(request_ids)
        self.session_id = session_id
        self.session = session  # the one its end updates (the id may change hands)
        self._abort = abort
        self._queue: asyncio.Queue[tuple[int, SeqOutput]] = asyncio.Queue()
        self._open = set(range(len(request_ids)))

    def put(self, index: int, output: SeqOutput) -> None:
        """Called on the event loop with each output the engine produced."""
        self._queue.put_nowait((index, output))

    @property
    def finished(self) -> bool:
        return not self._open

    async def __aiter__(self) -> AsyncIterator[tuple[int, SeqOutput]]:
        while self._open:
            index, output = await self._queue.get()
            if output.finish_reason is not None:
                self._open.discard(index)
            yield index, output

    def ready_nowait(self) -> list[tuple[int, SeqOutput]]:
        """Outputs already waiting, without blocking (lets a slow reader coalesce)."""
        items = []
        while self._open and not self._queue.empty():
            index, output = self._queue.get_nowait()
            if output.finish_reason is not None:
                self._open.discard(index)
            items.append((index, output))
        return items

    def abort(self) -> None:
        if self._open:
            self._abort([self.request_ids[i] for i in sorted(self._open)])

    async def __aenter__(self) -> Generation:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.abort()


class Engine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.state = EngineState.LOADING
        self.load_progress = 0.0
        self.load_phase = "loading"  # "downloading" while `config.fetch` runs
        self.load_error: str | None = None
        self._model: Model | None = None
        self._worker: Worker | None = None
        self._info: ModelInfo | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outstanding = 0  # sequences submitted and not yet finished (loop thread only)
        self._pending_embeds = 0
        self._cache: PrefixCache | None = None
        self._cache_lock = threading.Lock()  # opened by the engine thread or a route's
        self.sessions = SessionRegistry(config.sessions, on_retire=self._retire_session)
        # Per tenant (loop thread only): requests by hit kind, and prompt tokens reused.
        self._tenant_hits: dict[str, dict[str, int]] = {}
        self._tenant_reused: dict[str, int] = {}
        self._unloading = False
        # Every worker counts into this one: counters survive rebuilds and reloads.
        self._counters = StepCounters()
        # The engine thread's READY <-> RECOVERING moves never undo an unload or a close
        # (the event loop's), which take this lock too.
        self._state_lock = threading.Lock()
        self.load_seconds = 0.0  # how long the last load took (download included)
        self.loaded_bytes = 0  # weights + KV once loaded (0: not known yet)

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Load the model and start the engine thread. Returns at once; see `state`.

        Also loads an unloaded (or failed) engine again; a no-op while one runs."""
        if self._thread is not None and self._thread.is_alive():
            if not self._unloading:
                return
            self._thread.join()  # an unload still saving: normally waited for off the loop
        self._loop = asyncio.get_running_loop()
        self.state, self.load_error, self.load_progress = EngineState.LOADING, None, 0.0
        self._unloading = False
        self._thread = threading.Thread(target=self._main, name="kvserve-engine", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        started = time.monotonic()
        try:
            loaded = load(self.config, self, self._deliver, self._counters, self._open_cache_at)
        except Exception as exc:  # reported on /health; the process stays up to say so
            log.exception("model load failed")
            self.load_error = str(exc)
            self.state = EngineState.FAILED
            return
        worker = loaded.worker
        self._cache, self._info, self._model = loaded.cache, loaded.info, worker.model
        self.load_seconds = time.monotonic() - started
        self._worker = worker
        self.state = EngineState.READY
        log.info("engine ready: %s (%.1fs)", self.info.model_id, self.load_seconds)
        watchdog = Watchdog(lambda: self._worker)
        watchdog.start()
        try:
            while True:
                try:
                    worker.run()
                    break
                except Exception as exc:  # the loop died: rebuild it, keep the process
                    log.exception("the engine thread died; rebuilding it")
                    self._move(EngineState.READY, EngineState.RECOVERING)
                    worker = self._rebuild(worker, f"{type(exc).__name__}: {exc}")
                    self._worker = worker
                    self._move(EngineState.RECOVERING, EngineState.READY)
        finally:
            watchdog.stop()
            unloading = self._unloading
            self.state = EngineState.UNLOADED if unloading else EngineState.STOPPED
            self._worker = None
            self._model = None
            worker.ctx.close()
            if worker.embedder is not None:
                worker.embedder.ctx.close()
            worker.model.close()
            # Unloading keeps the cache (the slots' states were just saved into it), so
            # the model comes back warm; a stop closes it: queued saves reach the disk.
            if worker.cache is not None and not unloading:
                worker.cache.close()

    def _move(self, before: EngineState, after: EngineState) -> None:
        """Engine thread: `before` -> `after`, unless an unload or a close came first."""
        with self._state_lock:
            if self.state is before:
                self.state = after

    def _rebuild(self, old: Worker, cause: str) -> Worker:
        """A new context and scheduler (slots empty) on the same model, embedder, cache
        and counters, after every request of the old one failed at once naming `cause`."""
        try:
            abandon(old, cause)
        except Exception:
            log.exception("failing the requests of the dead engine thread failed")
        old.ctx.close()
        ctx = Context(old.model, old.ctx.params)
        if old.embedder is not None:
            old.embedder.jobs.clear()
            old.embedder.ctx.clear()
        worker = Worker(
            old.model,
            ctx,
            Scheduler(old.scheduler.config, self._counters),
            old.embedder,
            self._deliver,
            old.cache,
            old.limits,
        )
        self._counters.num_rebuilds += 1
        # The same queue: a command sent while this rebuild runs is not lost.
        worker.commands = old.commands
        worker._stopping = old._stopping
        return worker

    def close(self, timeout: float | None = None) -> None:
        """Stop the engine thread: running sequences are aborted, what the slots hold is
        saved and the cache's writes drained (they give up only on a writer that stops
        making progress, logging and counting what was not stored), handles freed.
        Waits for all of it, or `timeout` seconds."""
        if self._worker is not None and self._thread is not None and self._thread.is_alive():
            with self._state_lock:
                self._unloading = False
                self.state = EngineState.STOPPED  # before the thread ends: nothing slips in
            self._worker.commands.put(Stop())
            self._thread.join(timeout)
        elif self.state is EngineState.UNLOADED or not (self._thread and self._thread.is_alive()):
            if self.state is EngineState.UNLOADED:
                self.state = EngineState.STOPPED
            if self._cache is not None:  # open with no thread (unloaded, failed, never loaded)
                self._cache.close()

    def unload(self) -> bool:
        """Begin freeing the model and its context (event loop thread): from now on the
        engine takes no request (`ready` is False) and its thread stops; `wait_stopped`
        waits for that. What the slots hold is saved to the prefix cache first, and the
        cache and the sessions stay, so a later `start()` resumes warm. False if nothing
        was loaded."""
        worker, thread = self._worker, self._thread
        if worker is None or thread is None or not thread.is_alive():
            return False
        with self._state_lock:
            self._unloading = True
            self.state = EngineState.UNLOADED  # before the thread ends: no request slips in
        worker.commands.put(Stop())
        return True

    def wait_stopped(self, timeout: float = 30.0) -> bool:
        """Block until the engine thread has ended (call it off the event loop)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return thread is None or not thread.is_alive()

    @property
    def busy(self) -> bool:
        """Requests in flight or queued (an engine is only unloaded when idle)."""
        return self._outstanding > 0 or self._pending_embeds > 0

    @property
    def memory_bytes(self) -> int:
        """Weights + KV cache of the loaded model; before the first load, the GGUF's size."""
        if self.loaded_bytes:
            return self.loaded_bytes
        try:
            return os.path.getsize(self.config.model_path)
        except OSError:
            return 0

    # -- facts -----------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self.state is EngineState.READY

    @property
    def info(self) -> ModelInfo:
        if self._info is None:
            raise EngineNotReadyError("the model is not loaded")
        return self._info

    def _require_model(self) -> Model:
        if self.state is EngineState.RECOVERING:
            raise EngineRecoveringError("the engine is being rebuilt after a failure")
        if self._model is None or not self.ready:
            raise EngineNotReadyError("the model is still loading")
        return self._model

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        return self._require_model().tokenize(
            text, add_special=add_special, parse_special=parse_special
        )

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self._require_model().detokenize(tokens)

    def token_bytes(self, token: int) -> bytes:
        """The bytes a generated token contributes to the text (b"" for control tokens)."""
        return self._require_model().pieces[token]

    def stats(self) -> EngineStats | None:
        return self._worker.stats() if self._worker is not None else None

    @property
    def capacity(self) -> int:
        return self.config.n_seq_max + self.config.max_queue

    # -- generation ------------------------------------------------------------------

    async def generate(self, requests: Sequence[GenerateRequest]) -> Generation:
        """Validate and queue `requests` (the n choices of one API request).

        Raises InvalidRequestError (400), QueueFullError (429) or EngineNotReadyError
        (503) before anything is queued."""
        model = self._require_model()
        for request in requests:
            validate(request, self.info)
        session_id = requests[0].session_id if requests else None
        if session_id is not None and len(requests) > 1:
            raise InvalidRequestError("a session continues one sequence: n must be 1", param="n")
        if self._outstanding + len(requests) > self.capacity:
            raise QueueFullError()
        self._expire_sessions()
        session, created = (
            self.sessions.begin(requests[0].tenant, session_id, requests[0].session_pool)
            if session_id is not None
            else (None, False)
        )
        samplers: list[Sampler] = []
        try:
            samplers = await self._samplers(model, requests)
            hit, looked_up = await self._lookup(requests[0]) if requests else (None, None)
            # Re-checked after the awaits: an unload (or a rebuild) that began meanwhile
            # would leave a Submit in a queue nobody reads, the request waiting forever
            # and `_outstanding` raised for good (the model never unloadable again); and
            # samplers of a model unloaded and loaded again meanwhile point at freed memory.
            if self._require_model() is not model:
                raise EngineNotReadyError("the model was loaded again meanwhile; retry")
            if self._outstanding + len(requests) > self.capacity:
                raise QueueFullError()
        except BaseException:
            for sampler in samplers:  # never handed to the engine thread: ours to free
                sampler.close()
            if session is not None:  # a refused request leaves no session behind
                self.sessions.end(session, session.num_tokens)
                if created:
                    self.sessions.remove(session)
            raise
        generation = Generation(
            [r.request_id for r in requests], self._abort, session_id, session, requests[0].tenant
        )
        seqs = tuple(
            Seq(
                request,
                sampler,
                IncrementalDetokenizer(model.pieces, request.stop),
                (generation, index),
            )
            for index, (request, sampler) in enumerate(zip(requests, samplers, strict=True))
        )
        if seqs:
            seqs[0].cache_hit = hit
            seqs[0].t_lookup = looked_up
            if hit is not None:
                seqs[0].lookup_tier, seqs[0].lookup_tokens = hit.tier, hit.num_matched
            for sibling in seqs[1:]:  # n > 1: one prompt, prefilled once (see scheduler)
                sibling.leader = seqs[0]
        self._outstanding += len(seqs)
        assert self._worker is not None
        self._worker.commands.put(Submit(seqs))
        return generation

    async def _samplers(self, model: Model, requests: Sequence[GenerateRequest]) -> list[Sampler]:
        """The requests' samplers; built off the event loop when a grammar is compiled.
        A caller cancelled meanwhile leaves the build running: its samplers are freed
        when it ends."""
        if not any(r.sampling.grammar is not None for r in requests):
            return self._build_samplers(model, requests)
        building = asyncio.ensure_future(asyncio.to_thread(self._build_samplers, model, requests))
        try:
            return await asyncio.shield(building)
        except asyncio.CancelledError:
            building.add_done_callback(_close_built)
            raise

    async def _lookup(
        self, request: GenerateRequest
    ) -> tuple[CacheHit | None, tuple[float, float] | None]:
        """The longest cached prefix of the prompt, read off the event loop (a disk hit
        reads a file), and when the lookup started and ended (for traces). Skipped
        (None, None) when the session's own slot already holds its KV."""
        cache = self._cache
        if (
            cache is None
            or request.prompt_logprobs is not None
            or len(request.prompt_tokens) < cache.config.block_tokens
            or (
                request.session_id is not None
                and self.session_slot(pin_key(request.tenant, request.session_id)) is not None
            )
        ):
            return None, None
        started = time.monotonic()
        hit = await asyncio.to_thread(cache.lookup, request.prompt_tokens, request.prefix_salt)
        return hit, (started, time.monotonic())

    def _build_samplers(self, model: Model, requests: Sequence[GenerateRequest]) -> list[Sampler]:
        samplers: list[Sampler] = []
        try:
            for request in requests:
                seed = request.sampling.seed
                if seed is None:
                    seed = random.getrandbits(32)
                samplers.append(
                    Sampler(model, request.sampling, seed & 0xFFFFFFFF, self.info.n_ctx)
                )
        except ValueError as exc:
            for sampler in samplers:
                sampler.close()
            param = "grammar" if "grammar" in str(exc) else None
            raise InvalidRequestError(str(exc), param=param) from exc
        return samplers

    def _abort(self, request_ids: list[str]) -> None:
        if self._worker is not None:
            self._worker.commands.put(Abort(tuple(request_ids)))

    def _deliver(self, items: list[tuple[object, SeqOutput]]) -> None:
        """Engine thread: hand one step's outputs to the event loop in one wake-up."""
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is listening
            self._loop.call_soon_threadsafe(self._dispatch, items)

    def _dispatch(self, items: list[tuple[object, SeqOutput]]) -> None:
        for sink, output in items:
            generation, index = cast(tuple[Generation, int], sink)
            if output.finish_reason is not None:
                self._outstanding -= 1
                self._count_for_tenant(generation.tenant, output)
                if generation.session is not None:
                    self.sessions.end(generation.session, output.num_kv_tokens)
            generation.put(index, output)

    # -- sessions --------------------------------------------------------------------

    def _expire_sessions(self) -> None:
        for session in self.sessions.expired():
            self._command(ReleaseSession(session.key))

    def _retire_session(self, session: Session) -> None:
        """A bound retired this idle session to make room: its slot goes back (its KV
        to the cache first), so a later request with its prefix starts warm."""
        log.info("session %s of a key at its bound retired (idle since %.0f s)",
                 session.id, self.sessions.idle_seconds(session))  # fmt: skip
        self._command(ReleaseSession(session.key))

    def _command(self, command: ReleaseSession | Fork) -> None:
        if self._worker is not None:
            self._worker.commands.put(command)

    def create_session(
        self, tenant: str, session_id: str | None = None, ttl_s: float | None = None
    ) -> Session:
        self._expire_sessions()
        return self.sessions.create(tenant, session_id, ttl_s)

    def get_session(self, tenant: str, session_id: str) -> Session:
        self._expire_sessions()
        return self.sessions.get(tenant, session_id)

    def list_sessions(self, tenant: str) -> list[Session]:
        self._expire_sessions()
        return self.sessions.owned_by(tenant)

    def delete_session(self, tenant: str, session_id: str) -> Session:
        """End a session: its slot goes back to everyone (its KV stays reusable by
        requests with the same salt, and in the cache). A session with a request in
        flight answers SessionBusyError (409): its end would outlive the id."""
        session = self.get_session(tenant, session_id)
        if session.in_flight:
            raise SessionBusyError(f"session '{session_id}' has a request in flight")
        self.sessions.remove(session)
        self._command(ReleaseSession(session.key))
        return session

    def session_slot(self, key: str | None) -> int | None:
        """The slot the session (`Session.key`) pins right now, if any (a racy read,
        for reporting)."""
        if key is None or self._worker is None:
            return None
        return self._worker.scheduler.slots.pins.get(key)

    async def fork_session(
        self, tenant: str, session_id: str, new_id: str | None = None, ttl_s: float | None = None
    ) -> Session:
        """A new session whose KV is a copy of `session_id`'s (which must be idle).

        Raises SessionNotFoundError (404), SessionBusyError (409), NoSlotError (429),
        EngineNotReadyError (503: with no engine thread, nothing would do the copy)."""
        self._require_model()
        source = self.get_session(tenant, session_id)
        if source.in_flight:
            raise SessionBusyError(f"session '{session_id}' has a request in flight")
        target = self.sessions.create(
            tenant, new_id, source.ttl_s if ttl_s is None else ttl_s, spare=source
        )
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[int, str | None]] = loop.create_future()

        def on_done(num_tokens: int, error: str | None) -> None:  # engine thread
            loop.call_soon_threadsafe(_settle, num_tokens, error)

        def _settle(num_tokens: int, error: str | None) -> None:
            if not done.done():
                done.set_result((num_tokens, error))

        target.in_flight = True  # nobody may use it before its KV is in place
        self._command(Fork(source.key, target.key, on_done))
        try:
            num_tokens, error = await asyncio.shield(done)
        except asyncio.CancelledError:
            # The caller left: the fork still runs on the engine thread (commands run in
            # order), so release the new session's slot after it, and forget the session.
            self.sessions.remove(target)
            self._command(ReleaseSession(target.key))
            raise
        finally:
            target.in_flight = False
        if error is not None:
            self.sessions.remove(target)
            raise NoSlotError(f"cannot fork: {error}")
        target.num_tokens = num_tokens
        return target

    # -- cache -----------------------------------------------------------------------

    def open_cache(self) -> None:
        """Open the prefix cache now if it is not open yet: it exists whether or not the
        model is loaded (unloaded, failed, not loaded yet), so its stats, a tenant's view
        and purges reach its tiers. Its namespace needs the model file, so a hub model's
        cache opens with its first load. Blocking file I/O: call it off the event loop."""
        if self._info is not None:
            self._open_cache_at(self._info.path)
        elif self.config.fetch is None:
            self._open_cache_at(self.config.model_path)

    def _open_cache_at(self, model_path: str) -> PrefixCache | None:
        """The prefix cache, opened for `model_path` if it is not open yet (None: no
        cache configured, or the file can't be read). Called by the engine thread's load
        and by routes (off the event loop), hence the lock."""
        with self._cache_lock:
            if self._cache is None:
                self._cache = open_prefix_cache(self.config, model_path)
            return self._cache

    def cache_stats(self) -> CacheStats | None:
        return self._cache.stats() if self._cache is not None else None

    def tenant_cache_view(self, tenant: str, owns: Callable[[str], bool]) -> TenantCacheView:
        """What one tenant may see of the cache: its own prefixes (`owns` accepts their
        salts) and its own requests' counters; nothing of anyone else's."""
        entries, tokens = self._cache.entries_of(owns) if self._cache is not None else (0, 0)
        hits = self._tenant_hits.get(tenant, {})
        return TenantCacheView(
            entries, tokens, tuple(sorted(hits.items())), self._tenant_reused.get(tenant, 0)
        )

    def _count_for_tenant(self, tenant: str, output: SeqOutput) -> None:
        hits = self._tenant_hits.setdefault(tenant, {})
        hits[output.hit_kind] = hits.get(output.hit_kind, 0) + 1
        self._tenant_reused[tenant] = self._tenant_reused.get(tenant, 0) + output.num_cached_tokens

    def purge_cache(self, owns: Callable[[str], bool] | None = None) -> int:
        """Drop stored prefixes: every one, or those whose salt `owns` accepts (one
        tenant's), loaded or not. Slots keep theirs. Returns the entries removed."""
        self.open_cache()
        if self._cache is None:
            return 0
        return self._cache.purge() if owns is None else self._cache.purge_where(owns)

    # -- embeddings ------------------------------------------------------------------

    async def embed(self, inputs: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Mean-pooled, unit-length embeddings of token lists."""
        self._require_model()
        if not self.config.embeddings:
            raise InvalidRequestError("embeddings are disabled on this server", param="input")
        limit = self.config.embed_n_ctx
        for i, tokens in enumerate(inputs):
            if not tokens:
                raise InvalidRequestError(f"input[{i}] is empty", param="input")
            if len(tokens) > limit:
                raise InvalidRequestError(
                    f"input[{i}] has {len(tokens)} tokens; the limit is {limit}",
                    param="input",
                    code="context_length_exceeded",
                )
            if any(t < 0 or t >= self.info.n_vocab for t in tokens):
                raise InvalidRequestError(
                    f"input[{i}] contains a token id outside [0, {self.info.n_vocab})",
                    param="input",
                )
        if self._pending_embeds >= self.config.max_queue:
            raise QueueFullError()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[np.ndarray]] = loop.create_future()

        def on_done(results: list[np.ndarray] | None, error: str | None) -> None:
            loop.call_soon_threadsafe(_settle, results, error)

        def _settle(results: list[np.ndarray] | None, error: str | None) -> None:
            self._pending_embeds -= 1
            if future.done():
                return
            if results is None:
                future.set_exception(RuntimeError(error or "embedding cancelled"))
            else:
                future.set_result(results)

        job = EmbedJob([list(t) for t in inputs], on_done)
        self._pending_embeds += 1
        assert self._worker is not None
        self._worker.commands.put(Embed(job))
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            job.cancelled = True  # read by the engine thread at its next embedding step
            raise


def _close_built(building: asyncio.Future[list[Sampler]]) -> None:
    if not building.cancelled() and building.exception() is None:
        for sampler in building.result():
            sampler.close()
