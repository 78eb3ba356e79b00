"""Submitting work to the engine thread (event loop side): generation requests,
checked and given their samplers and cache lookups here, and embeddings; and the
outputs coming back, once per engine step.

A mixin of `Engine` (engine/engine.py), which owns the state named below.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import random
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, cast

import numpy as np

from cache import CacheHit, PrefixCache, recording_calls
from engine.commands import Abort, Embed, EmbedJob, EngineThread, Hold, OpenLane, Submit
from engine.config import EngineConfig
from engine.detokenizer import IncrementalDetokenizer
from engine.lane import Lane
from engine.llama import Model, Sampler
from engine.loop.generation import Generation
from engine.loop.sessions import SessionRegistry, unpinned_if_busy
from engine.loop.validation import validate
from engine.sequence import Sequence as Seq
from engine.sequence import pin_key
from engine.thinking import ThinkingBudget, constrained_from_start
from engine.types import (
    EngineNotReadyError,
    GenerateRequest,
    InvalidRequestError,
    ModelInfo,
    QueueFullError,
    SeqOutput,
    StoreCall,
)

# Cache lookups of one engine that run at once (a disk read, or a shared-store round trip
# of at most `shared_timeout_s`); more wait for a free thread of this pool only.
LOOKUP_THREADS = 4


class Submitting:
    config: EngineConfig
    sessions: SessionRegistry
    _worker: EngineThread | None
    _cache: PrefixCache | None
    _loop: asyncio.AbstractEventLoop | None
    _outstanding: int  # sequences submitted and not yet finished (loop thread only)
    _pending_embeds: int
    _lookups: ThreadPoolExecutor | None  # the cache lookups' own threads (see _lookup)

    if TYPE_CHECKING:  # defined by Engine and its other mixins

        @property
        def info(self) -> ModelInfo: ...
        @property
        def capacity(self) -> int: ...
        def _require_model(self) -> Model: ...
        def _expire_sessions(self) -> None: ...
        def session_slot(self, key: str | None) -> int | None: ...
        def _count_for_tenant(self, tenant: str, output: SeqOutput) -> None: ...

    async def generate(self, requests: Sequence[GenerateRequest]) -> Generation:
        """Validate and queue `requests` (the n choices of one API request).

        Raises InvalidRequestError (400), QueueFullError (429) or EngineNotReadyError
        (503) before anything is queued."""
        model = self._require_model()
        for request in requests:
            validate(request, self.info, model.vision.identity if model.vision else None)
        requests = unpinned_if_busy(self.sessions, requests)
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
            hit, seen, looked_up, calls = (
                await self._lookup(requests[0]) if requests else (None, -1, None, ())
            )
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
            [r.request_id for r in requests],
            self._abort,
            session_id,
            session,
            requests[0].tenant,
            hold=self._hold,
            open_lane=self._open_lane,
        )
        seqs = tuple(
            Seq(
                request,
                sampler,
                IncrementalDetokenizer(model.pieces, request.stop),
                (generation, index),
                ThinkingBudget.of(
                    request.thinking,
                    default=self.config.reasoning_budget,
                    free=not constrained_from_start(
                        request.sampling.grammar, request.sampling.grammar_lazy
                    ),
                ),
            )  # fmt: skip
            for index, (request, sampler) in enumerate(zip(requests, samplers, strict=True))
        )
        if seqs:
            seqs[0].cache_hit, seqs[0].cache_seen = hit, seen
            seqs[0].t_lookup, seqs[0].lookup_calls = looked_up, calls
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
    ) -> tuple[CacheHit | None, int, tuple[float, float] | None, tuple[StoreCall, ...]]:
        """The longest cached prefix of the prompt, read off the event loop (a disk hit
        reads a file), and the cache's `stored` count before it (the engine thread looks
        again if states are stored while the request waits: engine/thread/relookup.py);
        for traces, when the lookup started and ended and the calls it made to the shared
        store. Only for the states the prompt can start from (a blob-bound cache under
        exact reuse: placement.find_usable). Skipped (None, -1, None, ()) when the
        session's own slot already holds its KV."""
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
            return None, -1, None, ()

        worker, prompt, salt = self._worker, request.prompt_tokens, request.prefix_salt
        seen = cache.stored

        def lookup() -> tuple[CacheHit | None, tuple[StoreCall, ...]]:
            with recording_calls() as calls:
                hit = (worker.find_prefix(cache, prompt, salt) if worker is not None
                       else cache.lookup(prompt, salt))  # fmt: skip
                return hit, tuple(calls)

        started = time.monotonic()
        # On the engine's own threads, not asyncio's default pool: that one also runs
        # grammar builds, long tokenizes, the response store's Redis calls and the like,
        # and a request must not wait behind those for a lookup of a few milliseconds.
        if self._lookups is None:
            self._lookups = ThreadPoolExecutor(LOOKUP_THREADS, "kvserve-lookup")
        context = contextvars.copy_context()  # as asyncio.to_thread: trace context and all
        loop = asyncio.get_running_loop()
        hit, calls = await loop.run_in_executor(self._lookups, context.run, lookup)
        return hit, seen, (started, time.monotonic()), calls

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

    def _hold(self, request_ids: list[str]) -> None:
        if self._worker is not None:
            self._worker.commands.put(Hold(tuple(request_ids)))

    def _open_lane(self, request_id: str, lane: Lane) -> None:
        if self._worker is not None:
            self._worker.commands.put(OpenLane(request_id, lane))

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
