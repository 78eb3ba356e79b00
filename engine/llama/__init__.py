"""The one package that touches llama.cpp (through llama-cpp-python's ctypes bindings).

Everything above it deals in Python ints, bytes and numpy arrays. Handles are owned by
the objects here and freed by `close()`; except where a docstring says otherwise,
methods must be called from the engine thread only.

- backend.py: process-wide init, llama.cpp's logs, KV types, build and CPU facts
- model.py: `Model` (weights, vocabulary, LoRA adapters)
- context.py: `ContextParams`, `Batch`, `Context` (KV cells, decode, sequence states)
- sampler.py: `Sampler` (the sampler chain and its grammar)
- vision.py: `Vision` (a model's image projector, through libmtmd)
"""

from engine.llama.backend import (
    KV_TYPES,
    CaptureErrors,
    cpu_has_amx,
    gpu_offload_supported,
    init_backend,
)
from engine.llama.context import Batch, Context, ContextParams, EmbdBatch
from engine.llama.model import Model
from engine.llama.sampler import Sampler
from engine.llama.vision import Vision, projector_beside

__all__ = [
    "KV_TYPES",
    "Batch",
    "CaptureErrors",
    "Context",
    "ContextParams",
    "EmbdBatch",
    "Model",
    "Sampler",
    "Vision",
    "cpu_has_amx",
    "gpu_offload_supported",
    "init_backend",
    "projector_beside",
]
