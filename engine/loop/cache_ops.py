"""The engine's prefix cache (any thread but the engine's, see each method): opened
whether or not a model is loaded, its stats, one tenant's view of it, and purges.

A mixin of `Engine` (engine/engine.py), which owns the state named below.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from cache import CacheStats, PrefixCache
from engine.config import EngineConfig, open_prefix_cache
from engine.types import ModelInfo, SeqOutput, TenantCacheView


class CacheOps:
    config: EngineConfig
    _info: ModelInfo | None
    _cache: PrefixCache | None
    _cache_lock: threading.Lock  # opened by the engine thread or a route's
    # Per tenant (loop thread only): requests by hit kind, and prompt tokens reused.
    _tenant_hits: dict[str, dict[str, int]]
    _tenant_reused: dict[str, int]

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
