"""`EngineSettings`: the engine's tunables, declared once and checked where declared.

They are the `[engine]` section of the server's configuration (and each model's own
overrides of it) as they stand: the server reads TOML, environment and flags into this
dataclass and hands it down; `EngineConfig` (engine/thread/loading.py) is these settings plus
what one model's load needs. A value out of range raises ValueError("<key>: <rule>"),
which the server reports against the key it came from.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from engine.exact_rules import (
    exact_min_chunk,
    exact_min_rows,
    least_prefill_chunk,
    least_step_tokens,
)
from engine.llama import KV_TYPES, gpu_offload_supported
from engine.types import TimeLimits

EXTRA_BUFTS = ("auto", "on", "off")
_AT_LEAST_ONE = ("n_ctx", "n_seq_max", "n_batch", "prefill_chunk", "embed_n_ctx", "embed_chunk")
_NOT_NEGATIVE = ("max_queue", "n_threads", "n_gpu_layers", "prefill_timeout_s",
                 "token_timeout_s", "total_timeout_s", "decode_timeout_s")  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineSettings:
    n_ctx: int = 4096  # context of one sequence (prompt + output), in tokens
    n_seq_max: int = 8  # slots: sequences decoded together
    kv_unified: bool = False  # True: one pool of n_ctx cells shared by all slots
    n_batch: int = 512  # token budget of one step
    prefill_chunk: int = 256  # most prompt tokens of one sequence per step
    n_threads: int = 0  # 0: every core
    max_queue: int = 64  # sequences that may wait for a slot; more get 429
    embeddings: bool = True
    embed_n_ctx: int = 4096  # longest embedding input, in tokens
    embed_chunk: int = 256  # embedding tokens computed per engine step
    # True: reuse only KV that reproduces the cold output exactly, at the price of up to
    # 64 prompt tokens computed again (2 with flash_attn off) and decoded tokens never
    # reused (scheduler.exact_min_rows). docs/cache.md "Reuse, and exact reuse".
    exact_reuse: bool = False
    # Per-request time limits in seconds (0: none); past one the request ends with 504.
    prefill_timeout_s: float = 600.0
    token_timeout_s: float = 120.0
    total_timeout_s: float = 3600.0
    decode_timeout_s: float = 120.0  # one llama_decode, interrupted past it
    speculative: bool = False  # prompt-lookup drafts verified in the step (engine/speculation.py)
    flash_attn: bool = True
    type_k: str = "f16"  # KV cache element types (engine.llama.KV_TYPES)
    type_v: str = "f16"
    n_ubatch: int = 0  # 0: n_batch
    n_gpu_layers: int = 0  # needs a GPU build of llama-cpp-python
    extra_bufts: str = "auto"  # repacked weight buffers: "on", "off", "auto" (unless AMX)
    # Thinking tokens a request may generate before its close is forced, when it names
    # no budget (engine/thinking.py): -1 unlimited, 0 no thinking (llama-server's
    # --reasoning-budget). A template without a thinking block ignores it.
    reasoning_budget: int = -1

    def __post_init__(self) -> None:
        for key in _AT_LEAST_ONE:
            if getattr(self, key) < 1:
                raise ValueError(f"{key}: must be at least 1")
        for key in _NOT_NEGATIVE:
            if getattr(self, key) < 0:
                raise ValueError(f"{key}: must not be negative")
        if not -1 <= self.reasoning_budget <= 2**31 - 1:
            raise ValueError("reasoning_budget: -1 (unlimited) or a number of tokens")
        self._check_batch_sizes()
        self._check_kv_options()

    def _check_batch_sizes(self) -> None:
        """The scheduler's own minimums (in exact mode a prompt of min_rows+1 ..
        2*min_rows-1 tokens must be schedulable; min_rows depends on flash attention)."""
        min_rows = exact_min_rows(self.flash_attn)
        least = least_step_tokens(self.n_seq_max, self.exact_reuse, min_rows)
        if self.n_batch < least:
            rule = "n_seq_max"
            if self.exact_reuse:
                rule = f"{exact_min_chunk(min_rows)} + n_seq_max - 1"
            raise ValueError(f"n_batch: must be at least {rule} ({least}){self._with_exact()}")
        least = least_prefill_chunk(self.exact_reuse, min_rows)
        if self.prefill_chunk < least:
            raise ValueError(f"prefill_chunk: must be at least {least}{self._with_exact()}")

    def _with_exact(self) -> str:
        if not self.exact_reuse:
            return ""
        return f" with exact_reuse and flash_attn = {str(self.flash_attn).lower()}"

    def _check_kv_options(self) -> None:
        """The weight and KV options, and the combinations llama.cpp (or our promises)
        rule out."""
        for key in ("type_k", "type_v"):
            if getattr(self, key) not in KV_TYPES:
                raise ValueError(f"{key}: one of {', '.join(KV_TYPES)}")
        if self.type_v not in ("f16", "f32") and not self.flash_attn:
            raise ValueError("type_v: a quantized V cache needs flash_attn = true")
        if self.speculative and not self.flash_attn:
            # Without flash attention a chunk of 2+ rows is computed with other kernels
            # than a one-row decode, so verified drafts would not give plain decoding's output.
            raise ValueError("speculative: needs flash_attn = true (or set it false)")
        if self.n_ubatch < 0 or self.n_ubatch > self.n_batch:
            raise ValueError("n_ubatch: between 0 (= n_batch) and n_batch")
        if self.exact_reuse and 0 < self.n_ubatch < self.prefill_chunk:
            # A prompt chunk split over ubatches could end in one under exact_min_rows rows.
            raise ValueError("n_ubatch: at least prefill_chunk with exact_reuse (or 0)")
        if self.extra_bufts not in EXTRA_BUFTS:
            raise ValueError(f"extra_bufts: one of {', '.join(EXTRA_BUFTS)}")
        if self.n_gpu_layers > 0 and not gpu_offload_supported():
            raise ValueError(
                "n_gpu_layers: this llama-cpp-python build cannot offload to a GPU "
                "(reinstall it with CMAKE_ARGS, see docs/engine.md)"
            )

    @property
    def threads(self) -> int:
        return self.n_threads or os.cpu_count() or 1

    @property
    def limits(self) -> TimeLimits:
        return TimeLimits(
            self.prefill_timeout_s, self.token_timeout_s, self.total_timeout_s,
            self.decode_timeout_s,
        )  # fmt: skip

    @property
    def use_extra_bufts(self) -> bool | None:
        """llama.cpp's use_extra_bufts: None ("auto") leaves it to the CPU check."""
        return None if self.extra_bufts == "auto" else self.extra_bufts == "on"
