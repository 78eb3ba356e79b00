"""What one model's engine is configured with (`EngineConfig`: the `[engine]` settings
and what a load needs, `SessionLimits`), and its prefix cache opened from it.

Shared by both sides: the engine thread loads with it (engine/thread/loading.py), the
event loop sizes its session registry and opens the cache with no model loaded
(engine/loop/cache_ops.py).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cache import CacheBudget, CacheConfig, PrefixCache, model_fingerprint, namespace
from engine.settings import EngineSettings
from engine.types import LoraAdapter

log = logging.getLogger(__name__)

NO_PROJECTOR = "none"  # `mmproj` (a model entry's, EngineConfig's): no projector at all


@dataclass(frozen=True, slots=True)
class SessionLimits:
    default_ttl_s: float = 600.0
    max_ttl_s: float = 86400.0
    max_sessions: int = 1024  # in all (per pool)
    max_sessions_per_key: int = 256  # per key (and pool); past either, an idle one retires
    # A request on a session with one in flight: "unpinned" runs it without the session
    # (on what the cache holds), "refuse" answers 409 session_busy.
    when_busy: str = "unpinned"

    def __post_init__(self) -> None:  # the server's [sessions] section: "<key>: <rule>"
        if self.when_busy not in ("unpinned", "refuse"):
            raise ValueError("when_busy: must be 'unpinned' or 'refuse'")
        if not 0 < self.default_ttl_s <= self.max_ttl_s:
            raise ValueError("default_ttl_s: must be above 0 and at most max_ttl_s")
        for key in ("max_sessions", "max_sessions_per_key"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}: must be at least 1")


@dataclass(frozen=True, slots=True)
class EngineConfig(EngineSettings):
    """One model's engine: its settings (the `[engine]` keys, engine/settings.py) and
    what its load needs."""

    model_path: str
    model_id: str
    cache: CacheConfig | None = None  # None: no prefix cache beyond the slots
    # The process's one RAM and disk budget, shared by every model's cache (a server
    # makes one); None: this engine's cache sizes its own tiers from `cache`.
    cache_budget: CacheBudget | None = None
    sessions: SessionLimits = SessionLimits()
    # Called first on the engine thread when set: fetches the model (a hub download,
    # reporting its progress 0..1) and returns its local path, used instead of model_path.
    fetch: Callable[[Callable[[float], None]], str] | None = None
    loras: tuple[LoraAdapter, ...] = ()  # loaded with the model; requests pick among them
    # A vision projector GGUF loaded with the model (engine/llama/vision.py); "": the one
    # mmproj*.gguf beside the model file, if there is exactly one; NO_PROJECTOR: none.
    mmproj: str = ""
    # Called after `fetch` when set: the hub's projector for the fetched model ("": the
    # repository has none), used as `mmproj` (server/models/hub.py fetch, projector=True).
    fetch_mmproj: Callable[[Callable[[float], None]], str] | None = None

    @classmethod
    def of(
        cls, settings: EngineSettings, model_path: str, model_id: str, **rest: Any
    ) -> EngineConfig:
        """`settings` for the model at `model_path` (`rest`: cache, cache_budget,
        sessions, fetch, loras)."""
        tunables = {f.name: getattr(settings, f.name) for f in dataclasses.fields(EngineSettings)}
        return cls(model_path=model_path, model_id=model_id, **tunables, **rest)


def open_prefix_cache(cfg: EngineConfig, model_path: str) -> PrefixCache | None:
    """The prefix cache of `model_path` under `cfg` (None: none configured, or the file
    can't be read). Its namespace comes from the file and the configuration alone, so it
    is known before a load and the cache can be opened with the model unloaded."""
    if cfg.cache is None or not cfg.cache.enabled:
        return None
    try:
        fingerprint = model_fingerprint(model_path)
    except OSError as exc:  # the model cannot load either; it will say so
        log.warning("prefix cache not opened: %s", exc)
        return None
    # Everything that changes the layout of a sequence's KV state.
    layout = (cfg.n_ctx, cfg.type_k, cfg.type_v, "flash" if cfg.flash_attn else "no-flash")
    return PrefixCache(cfg.cache, namespace(fingerprint, *layout), cfg.cache_budget)
