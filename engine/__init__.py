"""The batched llama.cpp engine: one thread owns the context; asyncio talks to it."""

from engine.engine import Engine, EngineConfig, EngineState, Generation
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
    "ModelInfo",
    "QueueFullError",
    "SamplingParams",
    "SeqOutput",
]
