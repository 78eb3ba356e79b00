"""The engine as the server sees it: the one module server/ imports from engine/.

`EngineLike` is the narrow interface the server depends on (`Engine` implements it, and
so does the fake engine of the server tests); the rest are the values that cross the
seam: requests, outputs, errors, config and the rules config validation asks.
tests/test_layering.py holds server/ to this module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from cache import CacheBudget, CacheConfig, redis_client, redis_peer
from engine.config import NO_PROJECTOR, EngineConfig, SessionLimits
from engine.engine import Engine
from engine.exact_rules import (
    exact_min_chunk,
    exact_min_rows,
    least_prefill_chunk,
    least_step_tokens,
)
from engine.family import ftype_name
from engine.lane import Lane
from engine.llama import KV_TYPES, gpu_offload_supported
from engine.loop.generation import Generation
from engine.loop.sessions import Session, check_session_id
from engine.loop.validation import ContextOverflowError, fits_context
from engine.settings import EngineSettings
from engine.thinking import ThinkingSpec
from engine.types import (
    TIME_LIMIT_CODES,
    CacheStats,
    EngineError,
    EngineNotReadyError,
    EngineRecoveringError,
    EngineState,
    EngineStats,
    FinishReason,
    GenerateRequest,
    InvalidRequestError,
    LoraAdapter,
    Media,
    ModelFamily,
    ModelInfo,
    NoSlotError,
    QueueFullError,
    SamplingParams,
    SeqOutput,
    SessionBusyError,
    SessionNotFoundError,
    SessionPool,
    SpecialTokens,
    StoreCall,
    TenantCacheView,
    TierStats,
    TimeLimits,
    Timings,
    TokenLogprob,
    error_code,
    salt_of_prefix,
)

__all__ = [
    "KV_TYPES",
    "NO_PROJECTOR",
    "TIME_LIMIT_CODES",
    "CacheBudget",
    "CacheConfig",
    "CacheStats",
    "ContextOverflowError",
    "Engine",
    "EngineConfig",
    "EngineError",
    "EngineLike",
    "EngineNotReadyError",
    "EngineSettings",
    "EngineRecoveringError",
    "EngineState",
    "EngineStats",
    "FinishReason",
    "GenerateRequest",
    "Generation",
    "InvalidRequestError",
    "Lane",
    "LoraAdapter",
    "Media",
    "ModelFamily",
    "ModelInfo",
    "NoSlotError",
    "QueueFullError",
    "SamplingParams",
    "SeqOutput",
    "StoreCall",
    "Session",
    "SessionBusyError",
    "SessionLimits",
    "SessionNotFoundError",
    "SessionPool",
    "SpecialTokens",
    "TenantCacheView",
    "ThinkingSpec",
    "TierStats",
    "TimeLimits",
    "Timings",
    "TokenLogprob",
    "check_session_id",
    "error_code",
    "exact_min_chunk",
    "exact_min_rows",
    "fits_context",
    "ftype_name",
    "gpu_offload_supported",
    "least_prefill_chunk",
    "least_step_tokens",
    "redis_client",
    "redis_peer",
    "salt_of_prefix",
]


class EngineLike(Protocol):
    """The narrow engine interface the server depends on (a fake implements it in tests)."""

    state: EngineState
    load_progress: float
    load_phase: str  # "loading", or "downloading" while a hub fetch runs
    load_error: str | None
    load_refused: bool  # the load failed because the file is a model kvserve cannot serve

    @property
    def ready(self) -> bool: ...
    @property
    def info(self) -> ModelInfo: ...
    def start(self) -> None: ...
    def close(self, timeout: float = ...) -> None: ...
    def tokenize(
        self, text: str, *, add_special: bool = ..., parse_special: bool = ...
    ) -> list[int]: ...
    def tokenize_media(
        self, text: str, media: Sequence[Media], *, add_special: bool
    ) -> list[int]: ...
    def detokenize(
        self, tokens: list[int], *, remove_special: bool = ..., unparse_special: bool = ...
    ) -> str: ...
    def token_bytes(self, token: int) -> bytes: ...
    def special_piece(self, token: int) -> bytes: ...
    def stats(self) -> EngineStats | None: ...
    async def generate(self, requests: list[GenerateRequest]) -> Generation: ...
    async def embed(self, inputs: list[list[int]]) -> list[np.ndarray]: ...
    def create_session(
        self, tenant: str, session_id: str | None = ..., ttl_s: float | None = ...
    ) -> Session: ...
    def get_session(self, tenant: str, session_id: str) -> Session: ...
    def list_sessions(self, tenant: str) -> list[Session]: ...
    def all_sessions(self) -> list[Session]: ...
    def delete_session(self, tenant: str, session_id: str) -> Session: ...
    def session_slot(self, key: str | None) -> int | None: ...
    async def fork_session(
        self, tenant: str, session_id: str, new_id: str | None = ..., ttl_s: float | None = ...
    ) -> Session: ...
    def open_cache(self) -> None: ...
    def cache_stats(self) -> CacheStats | None: ...
    def tenant_cache_view(self, tenant: str, owns: Callable[[str], bool]) -> TenantCacheView: ...
    def purge_cache(self, owns: Callable[[str], bool] | None = ...) -> int: ...

    # On-demand loading (server/models/loader.py)
    load_seconds: float

    @property
    def busy(self) -> bool: ...
    @property
    def memory_bytes(self) -> int: ...
    def unload(self) -> bool: ...
    def wait_stopped(self, timeout: float = ...) -> bool: ...
