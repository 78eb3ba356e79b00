"""`Engine`: the asyncio-facing side of the engine thread.

The server talks only to this class (or to a fake with the same methods), through
engine/client.py. It runs on the event loop thread: requests are validated and their
samplers built here, then handed to the engine thread through its command queue;
outputs come back through `loop.call_soon_threadsafe`, once per engine step.

This module holds the lifecycle (load, rebuild after a crash, unload, close) and the
model's facts; its mixins the rest: engine/loop/submission.py (generate, embed),
session_ops.py, cache_ops.py. It is the wiring of the engine's two sides: it starts the
engine thread (engine/thread/: loading, worker, watchdog) and gives the loop side's mixins
the worker, which they see only as `commands.EngineThread`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from cache import CacheConfig, PrefixCache
from engine.commands import Stop
from engine.config import EngineConfig, SessionLimits
from engine.family import UnsupportedModelError
from engine.llama import Context, Model
from engine.loop.cache_ops import CacheOps
from engine.loop.generation import Generation
from engine.loop.session_ops import SessionOps
from engine.loop.sessions import SessionRegistry
from engine.loop.submission import Submitting
from engine.thread.loading import free_worker, load
from engine.thread.scheduler import Scheduler
from engine.thread.stats import StepCounters
from engine.thread.watchdog import Watchdog
from engine.thread.worker import Worker
from engine.types import (
    EngineNotReadyError,
    EngineRecoveringError,
    EngineState,
    EngineStats,
    InvalidRequestError,
    Media,
    ModelInfo,
)

log = logging.getLogger("kvserve.engine")


# Re-exported: the server builds engines from these.
__all__ = ["CacheConfig", "Engine", "EngineConfig", "EngineState", "Generation", "SessionLimits"]


class Engine(Submitting, SessionOps, CacheOps):
    def __init__(self, config: EngineConfig):
        self.config = config
        self.state = EngineState.LOADING
        self.load_progress = 0.0
        self.load_phase = "loading"  # "downloading" while `config.fetch` runs
        self.load_error: str | None = None
        self.load_refused = False  # an UnsupportedModelError: loading again cannot help
        self._model: Model | None = None
        self._worker: Worker | None = None
        self._info: ModelInfo | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outstanding = 0  # sequences submitted and not yet finished (loop thread only)
        self._pending_embeds = 0
        self._cache: PrefixCache | None = None
        self._cache_lock = threading.Lock()  # opened by the engine thread or a route's
        self._lookups: ThreadPoolExecutor | None = None  # made by the first cache lookup
        self.sessions = SessionRegistry(config.sessions, on_retire=self._retire_session)
        # Per tenant (loop thread only): requests by hit kind, and prompt tokens reused.
        self._tenant_hits: dict[str, dict[str, int]] = {}
        self._tenant_reused: dict[str, int] = {}
        self._unloading = False
        # Set by a close during a load (under `_state_lock`): the load stops at its next
        # step and frees what it made instead of publishing a worker (engine/thread/loading.py).
        self.load_cancelled = False
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
        self._unloading = self.load_cancelled = False
        self._thread = threading.Thread(target=self._main, name="kvserve-engine", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        started = time.monotonic()
        try:
            loaded = load(self.config, self, self._deliver, self._counters, self._open_cache_at)
        except UnsupportedModelError as exc:  # one clear line, no traceback: not a bug
            log.error("%s", exc)
            self.load_error, self.load_refused = str(exc), True
            self.state = EngineState.FAILED
            return
        except Exception as exc:  # reported on /health; the process stays up to say so
            if self.load_cancelled:  # a close stopped it (LoadCancelled, or llama.cpp's abort)
                self._close_cache()
                return
            log.exception("model load failed")
            self.load_error = str(exc)
            self.state = EngineState.FAILED
            return
        worker = loaded.worker
        with self._state_lock:  # a close now (or before) gets the worker freed, not served
            published = not self.load_cancelled
            if published:
                self._cache, self._info, self._model = loaded.cache, loaded.info, worker.model
                self.load_seconds = time.monotonic() - started
                self._worker = worker
                self.state = EngineState.READY
        if not published:
            free_worker(worker)
            self._close_cache()
            return
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
            free_worker(worker)
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
            old.abandon(cause)
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
        A load under way is cancelled: it stops at its next step (a hub download runs to
        its end first) and frees what it made; it never becomes a worker nobody owns.
        Waits for all of it, or `timeout` seconds."""
        with self._state_lock:
            thread, worker = self._thread, self._worker
            running = thread is not None and thread.is_alive()
            if running:
                self._unloading = False
                self.load_cancelled = True  # read by a load still running (see _main)
                self.state = EngineState.STOPPED  # before the thread ends: nothing slips in
        lookups, self._lookups = self._lookups, None
        if lookups is not None:  # idle once requests are refused; one running ends alone
            lookups.shutdown(wait=False)
        if running:
            assert thread is not None
            if worker is not None:
                worker.commands.put(Stop())
            thread.join(timeout)
            return
        if self.state is EngineState.UNLOADED:
            self.state = EngineState.STOPPED
        self._close_cache()  # open with no thread (unloaded, failed, never loaded)

    def _close_cache(self) -> None:
        if self._cache is not None:
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

    def tokenize_media(self, text: str, media: Sequence[Media], *, add_special: bool) -> list[int]:
        """`text` with one `info.media_marker` per image, in order: text tokenized as
        tokenize(parse_special=True) does, each image's positions as ids < 0 from its
        digest and position (engine/media.py). Blocking (decodes the images): call it off
        the event loop. InvalidRequestError(param="image N") for an image that cannot be
        decoded, (param="image") without a projector or when the markers and the images
        differ in number."""
        vision = self._require_model().vision
        if vision is None:
            raise InvalidRequestError(
                f"'{self.config.model_id}' takes no images (it has no vision projector)",
                param="image",
            )
        return vision.tokenize(text, media, add_special=add_special)

    def detokenize(
        self, tokens: Sequence[int], *, remove_special: bool = False, unparse_special: bool = False
    ) -> str:
        """llama.cpp's detokenize: specials dropped unless `unparse_special`; with
        `remove_special`, the BOS/EOS the vocabulary adds left out."""
        return self._require_model().detokenize(
            tokens, special=unparse_special, remove_special=remove_special
        )

    def special_piece(self, token: int) -> bytes:
        """The token's bytes with a special token written as its text (/tokenize's pieces)."""
        return self._require_model().special_piece(token)

    def token_bytes(self, token: int) -> bytes:
        """The bytes a generated token contributes to the text (b"" for control tokens)."""
        return self._require_model().pieces[token]

    def stats(self) -> EngineStats | None:
        return self._worker.stats() if self._worker is not None else None

    @property
    def capacity(self) -> int:
        return self.config.n_seq_max + self.config.max_queue
