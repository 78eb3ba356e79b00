"""The one module that touches llama.cpp (through llama-cpp-python's ctypes bindings).

Everything above this module deals in Python ints, bytes and numpy arrays. Handles are
owned by the objects here and freed by `close()`; except where a docstring says
otherwise, methods must be called from the engine thread only.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import llama_cpp as C
import numpy as np

from engine.grammar import LazyTrigger, check_gbnf
from engine.types import SamplingParams

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
        C.llama_backend_init()
        _backend_ready = True


class _CaptureErrors:
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


@dataclass(frozen=True, slots=True)
class ContextParams:
    n_ctx: int
    n_batch: int
    n_seq_max: int
    n_threads: int
    embeddings: bool = False
    kv_unified: bool = False
    flash_attn: bool = True
    type_k: str = "f16"  # a KV_TYPES name
    type_v: str = "f16"
    n_ubatch: int = 0  # 0: n_batch (one ubatch per step)


class Model:
    """A loaded GGUF model and its vocabulary.

    The vocabulary is immutable after load, so `tokenize`, `detokenize` and the token
    tables may be used from any thread (llama-server tokenizes on its HTTP threads too).
    """

    def __init__(
        self,
        path: str,
        *,
        on_progress: Callable[[float], None] | None = None,
        n_gpu_layers: int = 0,
        extra_bufts: bool | None = None,
    ):
        init_backend()
        if not os.path.isfile(path):
            raise FileNotFoundError(f"model file not found: {path}")
        params = C.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        # Repacked "extra" weight buffers (faster CPU kernels) by default, except on CPUs
        # with AMX: there llama.cpp's AMX matmul for Q4_1 weights segfaults on any batch
        # of more than one token (seen on the dev machine with llama-cpp-python 0.3.36).
        params.use_extra_bufts = (not cpu_has_amx()) if extra_bufts is None else extra_bufts
        # Keep the callback referenced on self: llama.cpp calls it during the load.
        self._progress_cb = None
        if on_progress is not None:

            def _progress(progress: float, _user: ctypes.c_void_p) -> bool:
                on_progress(float(progress))
                return True

            self._progress_cb = C.llama_progress_callback(_progress)
            params.progress_callback = self._progress_cb
        handle = C.llama_model_load_from_file(path.encode(), params)
        if not handle:
            raise RuntimeError(f"llama.cpp could not load the model at {path}")
        self.handle = handle
        self.path = path
        self.vocab = C.llama_model_get_vocab(handle)
        self.n_vocab: int = C.llama_vocab_n_tokens(self.vocab)
        self.n_embd: int = C.llama_model_n_embd(handle)
        self.n_ctx_train: int = C.llama_model_n_ctx_train(handle)
        self.add_bos: bool = bool(C.llama_vocab_get_add_bos(self.vocab))
        self.bos_id: int = C.llama_vocab_bos(self.vocab)
        self.eos_id: int = C.llama_vocab_eos(self.vocab)
        self.eog_ids: frozenset[int] = frozenset(
            t for t in range(self.n_vocab) if C.llama_vocab_is_eog(self.vocab, t)
        )
        # Piece bytes of every token, rendered without special tokens: the detokenizer
        # concatenates these, so a token costs a list lookup instead of a C call.
        self.pieces: list[bytes] = [self._piece(t, special=False) for t in range(self.n_vocab)]
        # A token for each byte value whose piece is that one byte: text of any
        # tokenization can be fed to a grammar byte by byte (see Sampler._arm).
        self.byte_tokens: dict[int, int] = {}
        for t, piece in enumerate(self.pieces):
            if len(piece) == 1:
                self.byte_tokens.setdefault(piece[0], t)
        self.loras: dict[str, typing.Any] = {}  # adapter id -> llama_adapter_lora handle

    def load_lora(self, adapter_id: str, path: str) -> None:
        """Load a LoRA adapter GGUF for this model (freed with the model)."""
        if not os.path.isfile(path):
            raise FileNotFoundError(f"LoRA adapter {adapter_id!r}: file not found: {path}")
        with _CaptureErrors() as errors:
            handle = C.llama_adapter_lora_init(self.handle, path.encode())
        if not handle:
            reason = "; ".join(e for e in errors if e) or "llama.cpp refused it"
            raise RuntimeError(f"LoRA adapter {adapter_id!r} ({path}): {reason}")
        self.loras[adapter_id] = handle

    def _piece(self, token: int, *, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = C.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = C.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def special_piece(self, token: int) -> bytes:
        """The token's bytes with special tokens rendered (as llama.cpp's grammar sees it)."""
        return self._piece(token, special=True)

    def token_text(self, token: int) -> str:
        """The token's text with special tokens rendered (for /tokenize pieces)."""
        return self._piece(token, special=True).decode("utf-8", "replace")

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(1 << 16)
        n = C.llama_model_meta_val_str(self.handle, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            C.llama_model_meta_val_str(self.handle, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Every metadata key and value but the tokenizer's (its arrays run to megabytes)."""
        out = []
        buf = ctypes.create_string_buffer(256)
        for i in range(C.llama_model_meta_count(self.handle)):
            if C.llama_model_meta_key_by_index(self.handle, i, buf, len(buf)) < 0:
                continue
            key = buf.value.decode("utf-8", "replace")
            value = None if key.startswith("tokenizer.") else self.meta(key)
            if value is not None:
                out.append((key, value))
        return tuple(out)

    def fim_tokens(self) -> tuple[int, int, int] | None:
        """(prefix, suffix, middle) fill-in-the-middle tokens, if the vocabulary has all."""
        ids = (C.llama_vocab_fim_pre(self.vocab), C.llama_vocab_fim_suf(self.vocab),
               C.llama_vocab_fim_mid(self.vocab))  # fmt: skip
        return None if min(ids) < 0 else ids

    def chat_template(self) -> str | None:
        ptr = C.llama_model_chat_template(self.handle, None)
        return ptr.decode("utf-8") if ptr else None

    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        C.llama_model_desc(self.handle, buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    def size_bytes(self) -> int:
        return int(C.llama_model_size(self.handle))

    def kv_bytes_per_cell(self) -> int:
        """Bytes of f16 K and V one KV cell takes over all layers (for memory budgets)."""
        n_head = max(1, C.llama_model_n_head(self.handle))
        head_dim = self.n_embd // n_head
        n_head_kv = C.llama_model_n_head_kv(self.handle)
        return 2 * 2 * int(C.llama_model_n_layer(self.handle)) * n_head_kv * head_dim

    def n_params(self) -> int:
        return int(C.llama_model_n_params(self.handle))

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buf = (C.llama_token * capacity)()
        n = C.llama_tokenize(self.vocab, data, len(data), buf, capacity, add_special, parse_special)
        if n < 0:
            capacity = -n
            buf = (C.llama_token * capacity)()
            n = C.llama_tokenize(
                self.vocab, data, len(data), buf, capacity, add_special, parse_special
            )
        return list(buf[:n])

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        if not tokens:
            return ""
        arr = (C.llama_token * len(tokens))(*tokens)
        capacity = max(64, len(tokens) * 8)
        buf = ctypes.create_string_buffer(capacity)
        n = C.llama_detokenize(self.vocab, arr, len(tokens), buf, capacity, False, special)
        if n < 0:
            capacity = -n
            buf = ctypes.create_string_buffer(capacity)
            n = C.llama_detokenize(self.vocab, arr, len(tokens), buf, capacity, False, special)
        return buf.raw[:n].decode("utf-8", "replace")

    def close(self) -> None:
        if self.handle:
            self.loras.clear()  # llama.cpp frees a model's adapters with the model
            C.llama_model_free(self.handle)
            self.handle = None


class Batch:
    """A `llama_batch` whose arrays are numpy buffers we own.

    Filling a prefill chunk is a few numpy slice assignments instead of one ctypes
    store per token. Each row belongs to exactly one sequence: `seq_id[i]` points at
    `seq_ids[i]`.
    """

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.tokens = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.n_seq_id = np.ones(capacity, dtype=np.int32)
        self.seq_ids = np.zeros(capacity, dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        i32p = ctypes.POINTER(ctypes.c_int32)
        self._seq_ptrs = (i32p * capacity)()
        base = self.seq_ids.ctypes.data
        for i in range(capacity):
            self._seq_ptrs[i] = ctypes.cast(base + 4 * i, i32p)
        self.struct = C.llama_batch(
            n_tokens=0,
            token=self.tokens.ctypes.data_as(i32p),
            embd=None,
            pos=self.pos.ctypes.data_as(i32p),
            n_seq_id=self.n_seq_id.ctypes.data_as(i32p),
            seq_id=ctypes.cast(self._seq_ptrs, ctypes.POINTER(i32p)),
            logits=self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)),
        )
        self.size = 0

    def clear(self) -> None:
        self.size = 0

    def add(self, seq_id: int, tokens: Sequence[int], start_pos: int, logits_last: bool) -> int:
        """Append a run of one sequence's tokens; return the row index of its last token."""
        n = len(tokens)
        i = self.size
        j = i + n
        if j > self.capacity:
            raise ValueError(f"batch overflow: {j} > {self.capacity}")
        self.tokens[i:j] = tokens
        self.pos[i:j] = np.arange(start_pos, start_pos + n, dtype=np.int32)
        self.seq_ids[i:j] = seq_id
        self.logits[i:j] = 0
        if logits_last:
            self.logits[j - 1] = 1
        self.size = j
        return j - 1

    def add_all_outputs(self, seq_id: int, tokens: Sequence[int], start_pos: int) -> None:
        """Append a run that asks for an output (embedding) at every row."""
        self.add(seq_id, tokens, start_pos, logits_last=False)
        self.logits[self.size - len(tokens) : self.size] = 1


class Context:
    """A llama context over a `Model`. Engine thread only."""

    def __init__(self, model: Model, params: ContextParams):
        cp = C.llama_context_default_params()
        cp.n_ctx = params.n_ctx
        cp.n_batch = params.n_batch
        cp.n_ubatch = params.n_ubatch or params.n_batch
        cp.type_k = KV_TYPES[params.type_k]
        cp.type_v = KV_TYPES[params.type_v]
        cp.n_seq_max = params.n_seq_max
        cp.n_threads = params.n_threads
        cp.n_threads_batch = params.n_threads
        # Separate KV streams per sequence (kv_unified off) make a sequence's attention
        # independent of what else is in the batch: greedy output is then the same
        # batched or alone. With one unified buffer it measurably is not (the attention
        # kernels see other sequences' cells), so unified is opt-in.
        cp.kv_unified = params.kv_unified
        on, off = C.LLAMA_FLASH_ATTN_TYPE_ENABLED, C.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.flash_attn_type = on if params.flash_attn else off
        cp.no_perf = True
        if params.embeddings:
            cp.embeddings = True
            # Mean pooling is done by the caller over per-token outputs, so that a long
            # input can be split over several steps without stalling generation.
            cp.pooling_type = C.LLAMA_POOLING_TYPE_NONE
        handle = C.llama_init_from_model(model.handle, cp)
        if not handle:
            raise RuntimeError("llama.cpp could not create a context (out of memory?)")
        self.handle = handle
        self.model = model
        self.params = params
        self.n_ctx: int = C.llama_n_ctx(handle)  # cells in all
        self.n_ctx_seq: int = C.llama_n_ctx_seq(handle)  # cells one sequence may use
        self.memory = C.llama_get_memory(handle)
        # Both kept referenced for as long as llama.cpp may call the callback.
        self._abort_flag = (ctypes.c_char * 2)()
        self._abort_fn = C.ggml_abort_callback(_STRLEN)
        C.llama_set_abort_callback(
            handle, self._abort_fn, ctypes.cast(self._abort_flag, ctypes.c_void_p)
        )
        self._lora: tuple[tuple[str, float], ...] = ()  # the adapter set applied now

    def interrupt(self) -> None:
        """Make the running (or next) llama_decode stop early, returning 2. Any thread."""
        self._abort_flag[0] = b"\x01"

    def set_loras(self, lora: tuple[tuple[str, float], ...]) -> None:
        """Apply these adapters (ids of `model.loras`, scales) to the next decodes. llama.cpp
        holds one adapter set per context: every row of a batch is computed with it."""
        if lora == self._lora:
            return
        handles = (C.llama_adapter_lora_p_ctypes * max(1, len(lora)))(
            *(self.model.loras[i] for i, _ in lora)
        )
        scales = (ctypes.c_float * max(1, len(lora)))(*(s for _, s in lora))
        if C.llama_set_adapters_lora(self.handle, handles, len(lora), scales) != 0:
            raise RuntimeError("llama.cpp refused the LoRA adapter set")
        self._lora = lora

    def decode(self, batch: Batch) -> int:
        """Run one llama_decode; 0 is success, 1 means no KV space, 2 interrupted,
        other values fail."""
        batch.struct.n_tokens = batch.size
        self._abort_flag[0] = b"\x00"
        return int(C.llama_decode(self.handle, batch.struct))

    def logits_row(self, row: int) -> np.ndarray:
        """A numpy view (no copy) of the logits of batch row `row`; valid until the next decode."""
        ptr = C.llama_get_logits_ith(self.handle, row)
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,))

    def embeddings(self, n_outputs: int) -> np.ndarray:
        """A (n_outputs, n_embd) view of the per-token embeddings of the last decode."""
        ptr = C.llama_get_embeddings(self.handle)
        if not ptr:
            raise RuntimeError("the context produced no embeddings")
        return np.ctypeslib.as_array(ptr, shape=(n_outputs, self.model.n_embd))

    def remove_seq(self, seq_id: int, start: int = 0) -> None:
        """Drop the KV cells of `seq_id` at positions >= start."""
        C.llama_memory_seq_rm(self.memory, seq_id, start, -1)

    def copy_seq(self, src: int, dst: int) -> bool:
        """Make `dst`'s KV a copy of all of `src`'s, now; False if llama.cpp refused.

        Not llama_memory_seq_cp: between streams it only queues the buffer copy for the
        next llama_decode, so a state restored into `src` (or saved from `dst`) before
        then was copied instead (issue 9: one tenant's prompt KV in another's fork).
        Going through the state blob is synchronous, and moves only the cells `src`
        holds (~23 KB a token) where the stream copy moved all n_ctx_seq cells."""
        if self.seq_pos_max(src) < 0:
            self.remove_seq(dst)
            return True
        return self.set_seq_state(dst, self.get_seq_state(src))

    def clear(self) -> None:
        C.llama_memory_clear(self.memory, True)

    def seq_pos_max(self, seq_id: int) -> int:
        """The largest position `seq_id` holds a cell for; -1 when it holds none."""
        return int(C.llama_memory_seq_pos_max(self.memory, seq_id))

    def get_seq_state(self, seq_id: int) -> bytes:
        """A copy of `seq_id`'s KV cells (llama_state_seq_get_data), for the prefix cache."""
        size = C.llama_state_seq_get_size(self.handle, seq_id)
        data = bytearray(size)
        written = C.llama_state_seq_get_data(
            self.handle, (ctypes.c_uint8 * size).from_buffer(data), size, seq_id
        )
        if written != size:
            raise RuntimeError(f"llama_state_seq_get_data wrote {written} of {size} bytes")
        # Handed over as bytes without a second copy of megabytes: nobody writes to it.
        return typing.cast(bytes, data)

    def set_seq_state(self, seq_id: int, state: bytes) -> bool:
        """Load a state from `get_seq_state` into the empty `seq_id`; False if refused."""
        # No copy either way: a pointer into the bytes object, or a view of a bytearray
        # (the cache hands back what get_seq_state made).
        if isinstance(state, bytes):
            src = ctypes.cast(ctypes.c_char_p(state), ctypes.POINTER(ctypes.c_uint8))
        else:
            src = (ctypes.c_uint8 * len(state)).from_buffer(state)
        with _CaptureErrors():
            read = C.llama_state_seq_set_data(self.handle, src, len(state), seq_id)
        return int(read) > 0

    def close(self) -> None:
        if self.handle:
            C.llama_free(self.handle)
            self.handle = None


_GRAMMAR_TOP = 256
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


class Sampler:
    """A per-sequence llama sampler chain, and a grammar sampler beside it.

    Built on the caller's thread (grammar compilation may take a while and its errors
    belong to the request), then owned by the engine thread.

    The grammar is not in the chain: checking all 49k candidates against it costs about
    30x a plain sample. As llama.cpp's own sampler does, the chain picks a token first
    and the grammar checks only that one; only when it is rejected does the grammar
    filter the whole vocabulary and the chain pick again.

    No path may make llama.cpp's grammar throw (see engine/grammar.py): every token is
    checked before the grammar accepts it, a lazy grammar's trigger is matched here in
    Python, and when the grammar admits no token `sample` returns None (the generation
    ends: the grammar is complete, or nothing the chain may pick fits it).
    """

    def __init__(self, model: Model, params: SamplingParams, seed: int, n_ctx: int):
        self._keep: list[object] = []  # ctypes arrays the chain may point into
        self.grammar: object | None = None
        self._model = model
        self._n_vocab = model.n_vocab
        self._trigger: LazyTrigger | None = None  # set while a lazy grammar waits
        chain_params = C.llama_sampler_chain_default_params()
        chain_params.no_perf = True
        self.handle = C.llama_sampler_chain_init(chain_params)
        try:
            self._build(model, params, seed, n_ctx)
        except BaseException:
            self.close()
            raise

    def _add(self, sampler: object) -> None:
        if not sampler:
            raise ValueError("llama.cpp rejected a sampler parameter")
        C.llama_sampler_chain_add(self.handle, sampler)

    def _build(self, model: Model, p: SamplingParams, seed: int, n_ctx: int) -> None:
        if p.grammar is not None:
            check_gbnf(p.grammar)
            if p.grammar_lazy:
                self._trigger = LazyTrigger(p.grammar_trigger_patterns, p.grammar_trigger_tokens)
            with _CaptureErrors() as errors:
                grammar = C.llama_sampler_init_grammar(model.vocab, p.grammar.encode(), b"root")
            if not grammar:
                reason = "; ".join(e for e in errors if e) or "the grammar does not parse"
                raise ValueError(f"invalid grammar: {reason}")
            self.grammar = grammar
            self._candidates = np.zeros(model.n_vocab, dtype=_TOKEN_DATA)
            self._one = np.zeros(1, dtype=_TOKEN_DATA)
        bias = list(p.logit_bias)
        if p.ignore_eos:
            bias += [(t, float("-inf")) for t in model.eog_ids]
        if bias:
            arr = (C.llama_logit_bias * len(bias))(*(C.llama_logit_bias(t, b) for t, b in bias))
            self._keep.append(arr)
            self._add(C.llama_sampler_init_logit_bias(model.n_vocab, len(bias), arr))
        if p.repeat_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0:
            last_n = n_ctx if p.repeat_last_n == -1 else p.repeat_last_n
            # This build's llama.cpp still takes n_vocab first (five arguments).
            self._add(
                C.llama_sampler_init_penalties(
                    model.n_vocab, last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty
                )
            )
        if p.dry_multiplier > 0.0:
            breakers = [s.encode() for s in p.dry_sequence_breakers]
            arr_b = (ctypes.c_char_p * len(breakers))(*breakers)
            self._keep.append(arr_b)
            self._add(
                C.llama_sampler_init_dry(
                    model.vocab,
                    p.dry_multiplier,
                    p.dry_base,
                    p.dry_allowed_length,
                    n_ctx if p.dry_penalty_last_n == -1 else p.dry_penalty_last_n,
                    arr_b,
                    len(breakers),
                )
            )
        if p.greedy:
            self._add(C.llama_sampler_init_greedy())
            return
        if p.mirostat == 1:
            self._add(C.llama_sampler_init_temp(p.temperature))
            self._add(
                C.llama_sampler_init_mirostat(
                    model.n_vocab, seed, p.mirostat_tau, p.mirostat_eta, 100
                )
            )
            return
        if p.mirostat == 2:
            self._add(C.llama_sampler_init_temp(p.temperature))
            self._add(C.llama_sampler_init_mirostat_v2(seed, p.mirostat_tau, p.mirostat_eta))
            return
        min_keep = p.min_keep
        if p.top_n_sigma > 0.0:
            self._add(C.llama_sampler_init_top_n_sigma(p.top_n_sigma))
        if p.top_k > 0:
            self._add(C.llama_sampler_init_top_k(p.top_k))
        if p.typical_p < 1.0:
            self._add(C.llama_sampler_init_typical(p.typical_p, min_keep))
        if p.top_p < 1.0:
            self._add(C.llama_sampler_init_top_p(p.top_p, min_keep))
        if p.min_p > 0.0:
            self._add(C.llama_sampler_init_min_p(p.min_p, min_keep))
        if p.xtc_probability > 0.0:
            self._add(C.llama_sampler_init_xtc(p.xtc_probability, p.xtc_threshold, min_keep, seed))
        if p.dynatemp_range > 0.0:
            self._add(
                C.llama_sampler_init_temp_ext(p.temperature, p.dynatemp_range, p.dynatemp_exponent)
            )
        else:
            self._add(C.llama_sampler_init_temp(p.temperature))
        self._add(C.llama_sampler_init_dist(seed))

    def sample(self, ctx: Context, row: int) -> int | None:
        """Sample from batch row `row` and accept the token into the chain's state.
        None: the grammar admits no token the chain may pick; the generation ends."""
        if self.grammar is None:
            return int(C.llama_sampler_sample(self.handle, ctx.handle, row))
        logits = ctx.logits_row(row)
        token = self._pick(logits, constrained=False)
        if self._trigger is not None:  # a lazy grammar, not triggered yet
            if not self._watch(token):
                return None
        elif not self._allows(token):  # rejected: filter everything, pick again
            token = self._pick(logits, constrained=True)
            if not self._allows(token):
                return None
            self._accept(token)
        else:
            self._accept(token)
        C.llama_sampler_accept(self.handle, token)
        return token

    def _allows(self, token: int) -> bool:
        one = self._one
        one[0] = (token, 0.0, 0.0)
        self._apply(self.grammar, one)
        return bool(np.isfinite(one[0]["logit"]))

    def _accept(self, token: int) -> None:
        # An end-of-generation token ends the sequence: the grammar needs no update
        # (and llama.cpp aborts on one it does not allow).
        if token not in self._model.eog_ids:
            C.llama_sampler_accept(self.grammar, token)

    def _watch(self, token: int) -> bool:
        """Free sampling until the trigger fires; then the grammar must accept the
        triggered text, or the generation ends (False)."""
        trigger = self._trigger
        assert trigger is not None
        if token in trigger.tokens:
            self._trigger = None
            if not self._allows(token):
                return False
            self._accept(token)
            return True
        if token in self._model.eog_ids:
            return True
        text = trigger.feed(self._model.special_piece(token))
        if text is None:
            return True
        self._trigger = None
        return self._feed(text)

    def _feed(self, text: bytes) -> bool:
        """Accept `text` into the grammar one byte token at a time, each checked."""
        for byte in text:
            token = self._model.byte_tokens.get(byte)
            if token is None or not self._allows(token):
                return False
            C.llama_sampler_accept(self.grammar, token)
        return True

    def _pick(self, logits: np.ndarray, *, constrained: bool) -> int:
        if constrained:
            # The grammar first filters the most likely tokens only; the whole
            # vocabulary (about 60 ms) only when none of those is allowed. Tokens
            # beyond the top few hundred carry next to no probability mass.
            top = np.argpartition(logits, -_GRAMMAR_TOP)[-_GRAMMAR_TOP:].astype(np.int32)
            few = np.zeros(len(top), dtype=_TOKEN_DATA)
            few["id"], few["logit"] = top, logits[top]
            self._apply(self.grammar, few)
            if np.isfinite(few["logit"]).any():
                return int(few[self._apply(self.handle, few)]["id"])
        cur = self._candidates
        cur["id"] = np.arange(self._n_vocab, dtype=np.int32)
        cur["logit"] = logits
        cur["p"] = 0.0
        if constrained:
            self._apply(self.grammar, cur)
        selected = self._apply(self.handle, cur)
        return int(cur[selected]["id"])

    @staticmethod
    def _apply(sampler: object, arr: np.ndarray) -> int:
        data = C.llama_token_data_array(
            data=arr.ctypes.data_as(ctypes.POINTER(C.llama_token_data)),
            size=len(arr),
            selected=-1,
            sorted=False,
        )
        C.llama_sampler_apply(sampler, ctypes.byref(data))
        return int(data.selected)

    def close(self) -> None:
        if self.handle:
            C.llama_sampler_free(self.handle)
            self.handle = None
        if self.grammar:
            C.llama_sampler_free(self.grammar)
            self.grammar = None
        self._keep.clear()

    def __del__(self) -> None:  # a request dropped before it reached the engine thread
        self.close()
