"""The batched llama.cpp engine: one thread owns the context; asyncio talks to it."""

from cache import redis_client  # the server's stored responses share the cache's store
from engine.engine import CacheConfig, Engine, EngineConfig, EngineState, Generation
from engine.llama import KV_TYPES, gpu_offload_supported
from engine.types import (
    EngineError,
    EngineNotReadyError,
    EngineStats,
    FinishReason,
    GenerateRequest,
    InvalidRequestError,
    ModelInfo,
    QueueFullError,
    SamplingParams,
    SeqOutput,
)

__all__ = [
    "CacheConfig",
    "Engine",
    "EngineConfig",
    "EngineError",
    "EngineNotReadyError",
    "EngineState",
    "EngineStats",
    "FinishReason",
    "GenerateRequest",
    "Generation",
    "InvalidRequestError",
    "KV_TYPES",
    "ModelInfo",
    "QueueFullError",
    "SamplingParams",
    "SeqOutput",
    "gpu_offload_supported",
    "redis_client",
]
