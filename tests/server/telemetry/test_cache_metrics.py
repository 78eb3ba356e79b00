"""/metrics lists the prefix cache's tiers as the cache reports them: one `tier` label
each, in its order, under the names the dashboards query (deploy/grafana)."""

from __future__ import annotations

from pathlib import Path

from cache import PrefixCache
from engine.client import EngineStats
from server.telemetry.metrics import cache_and_session_metrics
from tests.cache.util import config, saved


def test_each_configured_tier_is_one_label(tmp_path: Path) -> None:
    cache = PrefixCache(config(disk_dir=str(tmp_path)), "ns")
    try:
        saved(cache, [1] * 8)
        assert cache.lookup([1] * 8) is not None and cache.lookup([2] * 8) is None
        stats = EngineStats(num_slots=1, num_running=0, slots=(), cache=cache.stats())
    finally:
        cache.close(timeout=30)
    metrics = {m.name: m for m in cache_and_session_metrics("m", stats)}
    lookups = {
        (s.labels["tier"], s.labels["result"]): s.value
        for s in metrics["kvserve_cache_lookups"].samples
    }
    assert lookups == {
        ("ram", "hit"): 1,
        ("ram", "miss"): 1,
        ("disk", "hit"): 0,
        ("disk", "miss"): 1,
    }
    for name in ("kvserve_cache_entries", "kvserve_cache_tier_written_bytes"):
        by_tier = {s.labels["tier"]: s.value for s in metrics[name].samples}
        assert list(by_tier) == ["ram", "disk"] and by_tier["disk"] > 0, name
    assert all(s.labels["model"] == "m" for s in metrics["kvserve_cache_lookups"].samples)
