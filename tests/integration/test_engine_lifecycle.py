"""The engine's lifecycle meeting its requests (real model): an unload during a
request's awaits, samplers freed on every refusal, a failed load that frees what it
made, counters that never go backwards, and a drain that saves every resident slot."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import engine.loop.submission as submission_module
import engine.thread.loading as loading_module
from cache import CacheConfig, CacheHit
from engine.engine import Engine, EngineConfig, EngineState
from engine.llama import Context, Sampler
from engine.thread.runner import DecodeError
from engine.types import EngineNotReadyError, EngineStats, FinishReason, SamplingParams
from server.config.tree import default_model_path
from tests.integration.test_engine import chat_prompt, request, start
from tests.integration.test_speculation import TASKS

pytestmark = pytest.mark.model

CACHE = CacheConfig(block_tokens=16, min_tokens=16, disk_dir="")
LONG = "Tell me about the history of the city of Paris, its bridges and its river."


class Samplers:
    """Every Sampler the engine builds, so a test can see which were freed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.made: list[Sampler] = []
        made = self.made

        class Tracked(Sampler):
            def __init__(self, *args: Any, **kw: Any) -> None:
                super().__init__(*args, **kw)
                made.append(self)

        monkeypatch.setattr(submission_module, "Sampler", Tracked)

    @property
    def all_closed(self) -> bool:
        return bool(self.made) and all(s.handle is None for s in self.made)


@pytest.fixture
def samplers(monkeypatch: pytest.MonkeyPatch) -> Samplers:
    return Samplers(monkeypatch)


@pytest.fixture
async def cached() -> AsyncIterator[Engine]:
    """An engine of one slot with the prefix cache (RAM), closed after the test."""
    engine = await start(n_seq_max=1, n_threads=1, embeddings=False, cache=CACHE)
    try:
        yield engine
    finally:
        engine.close()


def blocking_lookup(engine: Engine) -> tuple[threading.Event, threading.Event]:
    """Make the engine's cache lookups wait (in their worker thread) for `release`."""
    cache = engine._cache
    assert cache is not None
    entered, release = threading.Event(), threading.Event()
    real = cache.lookup

    def lookup(tokens: Sequence[int], salt: str = "", held: bool = False) -> CacheHit | None:
        if not held:  # (the engine thread's second look: never made to wait)
            entered.set()
            assert release.wait(30)
        return real(tokens, salt, held)

    cache.lookup = lookup  # type: ignore[method-assign]
    return entered, release


async def test_an_unload_during_the_cache_lookup_refuses_the_request(
    samplers: Samplers, cached: Engine
) -> None:
    engine = cached
    prompt = chat_prompt(engine, LONG)
    entered, release = blocking_lookup(engine)
    try:
        pending = asyncio.create_task(engine.generate([request(prompt, max_tokens=4)]))
        assert await asyncio.to_thread(entered.wait, 30)
        assert engine.unload()
        release.set()
        with pytest.raises(EngineNotReadyError):  # not a Submit nobody reads, nor a 500
            await asyncio.wait_for(pending, 30)
        assert samplers.all_closed
        assert not engine.busy and await asyncio.to_thread(engine.wait_stopped)
        assert engine.state is EngineState.UNLOADED
        engine.start()  # and the model loads and serves again
        while engine.state is EngineState.LOADING:
            await asyncio.sleep(0.02)
        del engine._cache.lookup  # type: ignore[union-attr]  # the real one again
        generation = await engine.generate([request(prompt, max_tokens=4)])
        reasons = [out.finish_reason async for _, out in generation]
        assert reasons[-1] is FinishReason.LENGTH and not engine.busy
    finally:
        release.set()  # a failed check must not leave the lookup waiting


async def test_samplers_are_freed_when_the_lookup_fails_or_the_caller_leaves(
    samplers: Samplers, cached: Engine
) -> None:
    engine = cached
    prompt = chat_prompt(engine, LONG)
    cache = engine._cache
    assert cache is not None

    def broken(tokens: Sequence[int], salt: str = "", held: bool = False) -> CacheHit | None:
        raise OSError("the disk went away")

    cache.lookup = broken  # type: ignore[method-assign]
    with pytest.raises(OSError):
        await engine.generate([request(prompt, max_tokens=4)])
    assert samplers.all_closed and len(samplers.made) == 1
    del cache.lookup  # type: ignore[method-assign]

    entered, release = blocking_lookup(engine)
    grammar = SamplingParams(temperature=0.0, grammar='root ::= "yes" | "no"')
    leaving = asyncio.create_task(
        engine.generate([request(prompt, max_tokens=4, sampling=grammar)])
    )
    assert await asyncio.to_thread(entered.wait, 30)
    leaving.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert samplers.all_closed and len(samplers.made) == 2
    assert not engine.busy


async def test_a_failed_load_frees_the_contexts_it_made(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Context] = []
    real_init = Context.__init__

    def tracked(self: Context, *args: Any, **kw: Any) -> None:
        real_init(self, *args, **kw)
        made.append(self)

    monkeypatch.setattr(Context, "__init__", tracked)

    def refuse(*args: Any, **kw: Any) -> None:
        raise RuntimeError("the scheduler refuses")

    # The scheduler is made after both contexts exist: the load fails late. (Settings
    # the scheduler would refuse are refused earlier now, where they are declared.)
    monkeypatch.setattr(loading_module, "Scheduler", refuse)
    with pytest.raises(AssertionError, match="the scheduler refuses"):  # start(): not ready
        await start(n_seq_max=1, n_threads=1)
    assert len(made) == 2 and all(ctx.handle is None for ctx in made)


def counters(stats: EngineStats | None) -> dict[str, int]:
    assert stats is not None
    names = (
        "num_steps", "num_prefill_tokens", "num_generated_tokens", "num_preemptions",
        "num_reclaims", "num_reused_tokens", "num_drafted_tokens", "num_accepted_tokens",
        "batch_size_sum",
    )  # fmt: skip
    values = {name: getattr(stats, name) for name in names}
    values |= {f"hits.{k}": v for k, v in stats.hits}
    return values


def never_below(after: dict[str, int], before: dict[str, int]) -> list[str]:
    return [f"{k}: {before[k]} -> {after.get(k, 0)}" for k in before if after.get(k, 0) < before[k]]


async def test_counters_never_go_backwards_across_a_rebuild_and_a_reload() -> None:
    engine = await start(n_seq_max=2, n_threads=1, embeddings=False, speculative=True)
    try:
        worker = engine._worker
        assert worker is not None
        # Preemption: the first step running two sequences finds no KV space (code 1).
        real_run, fired = worker.runner.run, []

        def once(chunks: list[Any]) -> Any:
            if not fired and len({id(c.seq) for c in chunks}) > 1:
                fired.append(True)
                raise DecodeError(1)
            return real_run(chunks)

        worker.runner.run = once  # type: ignore[method-assign]
        echo = chat_prompt(engine, TASKS[0])  # copying: drafts are accepted
        runs = [engine.generate([request(echo, max_tokens=32)]) for _ in range(2)]
        for generation in await asyncio.gather(*runs):
            async for _ in generation:
                pass
        # Reclaims: three sessions on two slots.
        for i in range(3):
            generation = await engine.generate(
                [request(chat_prompt(engine, f"Say {i}."), max_tokens=2, session_id=f"s{i}")]
            )
            async for _ in generation:
                pass
        before = counters(engine.stats())
        assert before["num_preemptions"] and before["num_reclaims"]
        assert before["num_drafted_tokens"] and before["num_accepted_tokens"]

        def boom(*_: object) -> None:
            raise RuntimeError("injected")

        worker.step = boom  # type: ignore[method-assign]
        worker._fail_everything = boom  # type: ignore[method-assign]  # the loop dies
        async for _ in await engine.generate([request(echo, max_tokens=2)]):
            pass
        for _ in range(500):
            if engine._worker is not worker and engine.ready:
                break
            await asyncio.sleep(0.01)
        assert engine._worker is not worker and engine.ready
        assert never_below(counters(engine.stats()), before) == []

        assert engine.unload() and await asyncio.to_thread(engine.wait_stopped)
        engine.start()
        while engine.state is EngineState.LOADING:
            await asyncio.sleep(0.02)
        after = counters(engine.stats())
        assert never_below(after, before) == []
        stats = engine.stats()
        assert stats is not None and stats.num_rebuilds == 1
    finally:
        engine.close()


async def test_a_drain_saves_every_resident_slot(tmp_path: Path) -> None:
    cache = CacheConfig(block_tokens=16, min_tokens=16, disk_dir=str(tmp_path), writer_queue=1)
    engine = await start(n_seq_max=4, n_threads=1, embeddings=False, exact_reuse=False, cache=cache)
    store = engine._cache
    assert store is not None and store.tier("disk") is not None
    # The requests' own saves are refused, as a busy writer would: the slots keep
    # what only the drain saves.
    store.save = lambda *a, **kw: False  # type: ignore[method-assign]
    prompts = [chat_prompt(engine, f"{LONG} Question {i}: why?") for i in range(4)]
    runs = [engine.generate([request(p, max_tokens=2)]) for p in prompts]
    for generation in await asyncio.gather(*runs):
        async for _ in generation:
            pass
    del store.save  # type: ignore[method-assign]
    disk = store.tier("disk")
    assert disk is not None
    real_put = disk.put

    def slow_put(entry: Any) -> Any:  # a slow disk: the 1-deep queue stays full
        threading.Event().wait(0.3)
        return real_put(entry)

    disk.put = slow_put  # type: ignore[method-assign]
    await asyncio.to_thread(engine.close)
    stats = store.stats()
    assert (stats.saves, stats.saves_dropped, stats.disk.entries) == (4, 0, 4)


@pytest.mark.parametrize("when", ["download", "llama load", "model loaded", "contexts made"])
async def test_a_close_during_the_load_frees_everything_it_made(
    monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """Issue 28 item 5: a close while LOADING did nothing, and the load went on into an
    engine nobody owned (READY, its model and contexts held). Now it stops at its next
    step, whichever: during the download, inside llama.cpp's load, after it."""
    entered, release = threading.Event(), threading.Event()

    def pause(at: str) -> None:
        if at == when:
            entered.set()
            assert release.wait(30)

    models: list[Any] = []
    contexts: list[Context] = []

    class TrackedModel(loading_module.Model):  # type: ignore[name-defined, misc]
        def __init__(self, path: str, *, on_progress: Any, **kw: Any) -> None:
            def progress(value: float) -> bool:
                pause("llama load")
                return bool(on_progress(value))

            super().__init__(path, on_progress=progress, **kw)
            models.append(self)
            pause("model loaded")

    real_context = Context.__init__

    def tracked_context(self: Context, *args: Any, **kw: Any) -> None:
        real_context(self, *args, **kw)
        contexts.append(self)

    monkeypatch.setattr(loading_module, "Model", TrackedModel)
    monkeypatch.setattr(Context, "__init__", tracked_context)

    def fetch(progress: Any) -> str:
        pause("download")
        return default_model_path()

    config = EngineConfig("", "smol", n_seq_max=1, n_threads=1, cache=CACHE, fetch=fetch)
    engine = Engine(config)
    real_open = engine._open_cache_at

    def open_cache(path: str) -> Any:
        pause("contexts made")
        return real_open(path)

    engine._open_cache_at = open_cache  # type: ignore[method-assign]
    engine.start()
    try:
        assert await asyncio.to_thread(entered.wait, 30)
        assert engine.state is EngineState.LOADING
        engine.close(timeout=0)  # returns at once: the load is paused
        release.set()
        assert await asyncio.to_thread(engine.wait_stopped, 20), "the load went on"
        assert engine.state is EngineState.STOPPED and engine._worker is None
        assert all(m.handle is None for m in models) and all(c.handle is None for c in contexts)
        if when == "contexts made":
            assert len(models) == 1 and len(contexts) == 2  # made, then freed
        if when == "download":
            assert models == []  # never loaded at all
    finally:
        release.set()
        engine.close()
