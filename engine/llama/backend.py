"""llama.cpp's process-wide side: backend init, its log lines routed into `logging`,
errors captured per thread, KV element types, and what this build and CPU support."""

from __future__ import annotations

import ctypes
import logging
import threading

import llama_cpp as C
from llama_cpp import mtmd_cpp as M

log = logging.getLogger("kvserve.llama")

# ggml's log levels: 1 debug, 2 info, 3 warn, 4 error, 5 "continue the last line".
_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_ERROR = 4
_local = threading.local()


@C.llama_log_callback
def _log_callback(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    # Module-level so that the ctypes callback outlives every call llama.cpp makes to it.
    captured = getattr(_local, "captured", None)
    if captured is None and not log.isEnabledFor(_LEVELS.get(level, logging.DEBUG)):
        return  # below `logging.llama_level`: skip the decoding (load logs hundreds of lines)
    message = text.decode("utf-8", "replace").rstrip("\n")
    if captured is not None and level == _ERROR:
        captured.append(message)
    if message:
        log.log(_LEVELS.get(level, logging.DEBUG), "%s", message)


_backend_ready = False

# The abort callback llama.cpp checks between graph nodes is libc's `strlen` over a
# two-byte flag owned by the context: nonzero (true) once another thread writes 1 into
# the first byte. A Python callback would need the GIL at every node of every decode
# (and wait for it whenever the event loop holds it); this costs nothing.
_STRLEN: int = ctypes.cast(ctypes.CDLL(None).strlen, ctypes.c_void_p).value or 0


def init_backend() -> None:
    """Initialise llama.cpp once per process and route its log lines into `logging`."""
    global _backend_ready
    if not _backend_ready:
        C.llama_log_set(_log_callback, ctypes.c_void_p(0))
        # libmtmd (a projector's load) logs on its own, to stderr unless told: its
        # errors (a projector for another model's width) are captured like llama.cpp's.
        M.mtmd_log_set(_log_callback, ctypes.c_void_p(0))
        C.llama_backend_init()
        _backend_ready = True


class CaptureErrors:
    """Collect llama.cpp's error log lines emitted by this thread inside the block."""

    def __enter__(self) -> list[str]:
        _local.captured = []
        return _local.captured  # type: ignore[no-any-return]

    def __exit__(self, *exc: object) -> None:
        _local.captured = None


# KV cache element types by the names llama-server takes (--cache-type-k/-v).
KV_TYPES = {
    "f32": C.GGML_TYPE_F32,
    "f16": C.GGML_TYPE_F16,
    "q8_0": C.GGML_TYPE_Q8_0,
    "q4_0": C.GGML_TYPE_Q4_0,
    "q4_1": C.GGML_TYPE_Q4_1,
    "q5_0": C.GGML_TYPE_Q5_0,
    "q5_1": C.GGML_TYPE_Q5_1,
}


def cpu_has_amx() -> bool:
    """Whether this CPU has AMX tiles (Linux: /proc/cpuinfo), where llama.cpp's repacked
    AMX kernels are used for weights in "extra" buffers."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return any(line.startswith("flags") and " amx_tile" in line for line in f)
    except OSError:
        return False


def gpu_offload_supported() -> bool:
    """Whether this llama-cpp-python build can offload layers (CUDA, Metal, Vulkan...)."""
    init_backend()
    return bool(C.llama_supports_gpu_offload())
