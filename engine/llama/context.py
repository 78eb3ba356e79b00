"""`Batch` and `Context`: one llama_decode's rows, and the context that runs them
(KV cells, sequence states, LoRA set, the abort flag). Engine thread only."""

from __future__ import annotations

import ctypes
import typing
from collections.abc import Sequence
from dataclasses import dataclass

import llama_cpp as C
import numpy as np

from engine.llama.backend import _STRLEN, KV_TYPES, CaptureErrors
from engine.llama.model import Model


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
    swa_full: bool = True  # sliding-window layers keep every cell (see Context); bench only


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
        if n == 1:  # a decode row, each step of every generation: no temporary arrays
            self.tokens[i], self.pos[i], self.seq_ids[i] = tokens[0], start_pos, seq_id
            self.logits[i] = logits_last
            self.size = j
            return i
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


class EmbdBatch:
    """A `llama_batch` of input embeddings for one sequence (rows float32, n_embd wide)."""

    def __init__(self, capacity: int, n_embd: int):
        self.capacity, self.n_embd = capacity, n_embd
        self.embd = np.zeros((capacity, n_embd), dtype=np.float32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.n_seq_id = np.ones(capacity, dtype=np.int32)
        self.seq_ids = np.zeros(capacity, dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        i32p = ctypes.POINTER(ctypes.c_int32)
        self._seq_ptrs = (i32p * capacity)()
        for i in range(capacity):
            self._seq_ptrs[i] = ctypes.cast(self.seq_ids.ctypes.data + 4 * i, i32p)
        self.struct = C.llama_batch(
            n_tokens=0,
            token=None,
            embd=self.embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
            pos=self.pos.ctypes.data_as(i32p),
            n_seq_id=self.n_seq_id.ctypes.data_as(i32p),
            seq_id=ctypes.cast(self._seq_ptrs, ctypes.POINTER(i32p)),
            logits=self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)),
        )

    def fill(self, seq_id: int, rows: np.ndarray, start_pos: int, logits_last: bool) -> None:
        n = len(rows)
        if n > self.capacity:
            raise ValueError(f"batch overflow: {n} > {self.capacity}")
        self.embd[:n] = rows
        self.pos[:n] = np.arange(start_pos, start_pos + n, dtype=np.int32)
        self.seq_ids[:n] = seq_id
        self.logits[:n] = 0
        self.logits[n - 1] = int(logits_last)
        self.struct.n_tokens = n


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
        # Sliding-window layers keep every position's cells (llama.cpp's default, set here
        # so that it stays): a slot, a restored state or a fork can then be cut back to
        # any prefix, and a warm start never attends over cells that fell out of a
        # window-sized ring. bench/swa_memory.py measures what that costs (docs/models.md
        # "Model families"); the engine always keeps the default.
        cp.swa_full = params.swa_full
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
        # The last logits row's address and its view: a single-row decode's logits sit
        # at the same address step after step (see `logits_row`).
        self._logits_at: tuple[int, np.ndarray] = (0, np.empty(0, dtype=np.float32))
        self._logits_type = ctypes.c_float * model.n_vocab

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

    def decode_embeddings(self, struct: C.llama_batch, *, causal: bool = True) -> int:
        """`decode` of a batch of input embeddings (an image's rows,
        engine/thread/media_prefill.py); `causal=False`: its rows attend to each other both
        ways, as the projector asks."""
        self._abort_flag[0] = b"\x00"
        if causal:
            return int(C.llama_decode(self.handle, struct))
        C.llama_set_causal_attn(self.handle, False)
        try:
            return int(C.llama_decode(self.handle, struct))
        finally:
            C.llama_set_causal_attn(self.handle, True)

    def logits_row(self, row: int) -> np.ndarray:
        """A numpy view (no copy) of the logits of batch row `row`; valid until the next decode.

        Making a view costs tens of microseconds right after a decode has pushed
        everything else out of the CPU's caches, on every generated token; the view of
        the last address is kept and handed out again when llama.cpp names it again."""
        address = ctypes.cast(C.llama_get_logits_ith(self.handle, row), ctypes.c_void_p).value
        last, view = self._logits_at
        if address != last:
            if not address:
                raise ValueError(f"no logits for batch row {row}")
            view = np.frombuffer(memoryview(self._logits_type.from_address(address)), np.float32)
            self._logits_at = (address, view)
        return view

    def embeddings(self, n_outputs: int) -> np.ndarray:
        """A (n_outputs, n_embd) view of the per-token embeddings of the last decode."""
        ptr = C.llama_get_embeddings(self.handle)
        if not ptr:
            raise RuntimeError("the context produced no embeddings")
        return np.ctypeslib.as_array(ptr, shape=(n_outputs, self.model.n_embd))

    def remove_seq(self, seq_id: int, start: int = 0) -> bool:
        """Drop the KV cells of `seq_id` at positions >= start. False: llama.cpp refused,
        and the sequence is unchanged (a recurrent memory cannot drop a tail of the one
        state it holds per sequence); dropping everything (start 0) always succeeds."""
        return bool(C.llama_memory_seq_rm(self.memory, seq_id, start, -1))

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

    def seq_pos_min(self, seq_id: int) -> int:
        """The smallest position `seq_id` holds a cell for; -1 when it holds none."""
        return int(C.llama_memory_seq_pos_min(self.memory, seq_id))

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
        with CaptureErrors():
            read = C.llama_state_seq_set_data(self.handle, src, len(state), seq_id)
        return int(read) > 0

    def close(self) -> None:
        if self.handle:
            C.llama_free(self.handle)
            self.handle = None
