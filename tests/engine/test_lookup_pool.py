"""The engine's cache lookups run on its own threads (issue 28 item 8): with asyncio's
default pool taken by slow work (pulls did hold it for a whole download), a request's
lookup still runs. No model: the prefix cache of an engine that is not loaded."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cache import CacheConfig
from engine.engine import Engine, EngineConfig
from engine.types import GenerateRequest

TOKENS = tuple(range(1, 9))


async def test_a_lookup_does_not_wait_for_the_default_pool(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 1024)  # the cache's namespace reads the file only
    cache = CacheConfig(disk_dir="", block_tokens=4, min_tokens=4)
    engine = Engine(EngineConfig(model_path=str(model), model_id="m", cache=cache))
    engine.open_cache()
    assert engine._cache is not None and engine._cache.save(TOKENS, b"kv" * 8)
    assert engine._cache.flush(10)
    loop = asyncio.get_running_loop()
    pool = ThreadPoolExecutor(2)
    loop.set_default_executor(pool)
    release = threading.Event()
    held = [asyncio.to_thread(release.wait, 30) for _ in range(2)]  # the pool is full
    held_tasks = [asyncio.ensure_future(h) for h in held]
    try:
        await asyncio.sleep(0.05)
        hit, _, _, _ = await asyncio.wait_for(engine._lookup(GenerateRequest("r", TOKENS)), 10)
        assert hit is not None and hit.num_matched == len(TOKENS) and hit.tier == "ram"
    finally:
        release.set()
        await asyncio.gather(*held_tasks)
        engine.close()
