"""Every model's prefix cache within one `[cache]` budget (issue 28, item 9): two
configured models and a pulled one, real engines that are not loaded (their caches open
without a load; the files are not GGUFs), saves of both kept within `ram_bytes`."""

from __future__ import annotations

from pathlib import Path

from cache import CacheConfig
from engine.engine import Engine
from server.app import create_app
from server.config.tree import HubSection, ModelSection, Settings

ENTRY = 1000 + 4 * 8  # a state of 1000 bytes for 8 tokens


def _saved(engine: Engine, first: int, count: int) -> None:
    engine.open_cache()
    cache = engine._cache
    assert cache is not None
    for i in range(count):
        assert cache.save(list(range(first + 100 * i, first + 100 * i + 8)), b"s" * 1000)
        assert cache.flush(10)


def _ram_bytes(engines: list[Engine]) -> int:
    total = 0
    for engine in engines:
        stats = engine.cache_stats()
        total += stats.ram.bytes if stats is not None else 0
    return total


def test_the_models_caches_share_one_ram_budget(tmp_path: Path) -> None:
    files = []
    for name in ("a", "b"):
        path = tmp_path / f"{name}.gguf"
        path.write_bytes(name.encode() * 4096)  # two files: two namespaces
        files.append(path)
    settings = Settings(
        models=tuple(
            ModelSection(id=p.stem, path=str(p), load="on_demand") for p in files
        ),
        cache=CacheConfig(ram_bytes=5 * ENTRY, disk_dir="", block_tokens=4, min_tokens=4),
        hub=HubSection(cache_dir=str(tmp_path / "hf")),
    )
    app = create_app(settings)
    engines: list[Engine] = [m.engine for m in app.state.models]  # type: ignore[misc]
    try:
        a, b = engines
        _saved(a, 0, 4)
        _saved(b, 10_000, 4)  # b's saves take a's room, not room of their own
        assert _ram_bytes(engines) <= 5 * ENTRY
        assert a.cache_stats().ram.entries == 1  # type: ignore[union-attr]
        # A pulled model's engine counts into the same budget.
        pulled = app.state.hub_models.make_engine("hf.co/o/r:Q8_0", str(files[0]))
        assert pulled.config.cache_budget is app.state.cache_budget
        # A model closed (deleted) gives its RAM back; the other may use all of it.
        a.close()
        assert _ram_bytes([b]) == app.state.cache_budget.ram.total_bytes
        _saved(b, 20_000, 1)
        assert b.cache_stats().ram.entries == 5  # type: ignore[union-attr]
        assert app.state.cache_budget.ram.total_bytes <= 5 * ENTRY
    finally:
        for engine in engines:
            engine.close()
