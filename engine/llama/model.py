"""`Model`: a loaded GGUF model, its vocabulary and token tables, its LoRA adapters."""

from __future__ import annotations

import ctypes
import os
import typing
from collections.abc import Callable, Sequence

import llama_cpp as C

from engine.family import ModelFamily, quantization_name
from engine.llama.backend import CaptureErrors, cpu_has_amx, init_backend
from engine.special_tokens import SpecialTokens

if typing.TYPE_CHECKING:
    from engine.llama.vision import Vision

SPECIAL_NAMES = tuple(SpecialTokens.__dataclass_fields__)  # bos, eos, ... fim_sep


class Model:
    """A loaded GGUF model and its vocabulary.

    The vocabulary is immutable after load, so `tokenize`, `detokenize` and the token
    tables may be used from any thread (llama-server tokenizes on its HTTP threads too).
    """

    def __init__(
        self,
        path: str,
        *,
        on_progress: Callable[[float], bool | None] | None = None,
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
                # False (a close during the load) makes llama.cpp abandon the load.
                return on_progress(float(progress)) is not False

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
        # The vision projector loaded beside it (engine/llama/vision.py), freed before it.
        self.vision: Vision | None = None

    def load_lora(self, adapter_id: str, path: str) -> None:
        """Load a LoRA adapter GGUF for this model (freed with the model)."""
        if not os.path.isfile(path):
            raise FileNotFoundError(f"LoRA adapter {adapter_id!r}: file not found: {path}")
        with CaptureErrors() as errors:
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
        t = self.special_tokens()
        if t.fim_pre is None or t.fim_suf is None or t.fim_mid is None:
            return None
        return t.fim_pre, t.fim_suf, t.fim_mid

    def special_tokens(self) -> SpecialTokens:
        """The special token ids, each read by its `llama_vocab_<name>` function."""
        return SpecialTokens.from_ids(
            {name: int(getattr(C, f"llama_vocab_{name}")(self.vocab)) for name in SPECIAL_NAMES}
        )

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
        n_head = max(1, int(C.llama_model_n_head(self.handle)))
        head_dim = self.n_embd // n_head
        n_head_kv = int(C.llama_model_n_head_kv(self.handle))
        return 2 * 2 * int(C.llama_model_n_layer(self.handle)) * n_head_kv * head_dim

    def n_params(self) -> int:
        return int(C.llama_model_n_params(self.handle))

    def family(self) -> ModelFamily:
        """What kind of model this is, in llama.cpp's own words (engine/family.py)."""
        h = self.handle
        return ModelFamily(
            architecture=self.meta("general.architecture") or "unknown",
            n_swa=max(0, int(C.llama_model_n_swa(h))),
            recurrent=bool(C.llama_model_is_recurrent(h)),
            hybrid=bool(C.llama_model_is_hybrid(h)),
            has_encoder=bool(C.llama_model_has_encoder(h)),
            diffusion=bool(C.llama_model_is_diffusion(h)),
            n_ctx_train=self.n_ctx_train,
            n_params=self.n_params(),
            n_layer=int(C.llama_model_n_layer(h)),
            n_embd=self.n_embd,
            size_bytes=self.size_bytes(),
            quantization=quantization_name(int(C.llama_model_ftype(h))),
        )

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

    def detokenize(
        self, tokens: Sequence[int], *, special: bool = False, remove_special: bool = False
    ) -> str:
        """`special`: special tokens written as their text (llama.cpp's unparse_special);
        `remove_special`: a leading BOS and trailing EOS the vocabulary adds left out."""
        if not tokens:
            return ""
        arr = (C.llama_token * len(tokens))(*tokens)
        capacity = max(64, len(tokens) * 8)
        buf = ctypes.create_string_buffer(capacity)
        args = (remove_special, special)
        n = C.llama_detokenize(self.vocab, arr, len(tokens), buf, capacity, *args)
        if n < 0:
            capacity = -n
            buf = ctypes.create_string_buffer(capacity)
            n = C.llama_detokenize(self.vocab, arr, len(tokens), buf, capacity, *args)
        return buf.raw[:n].decode("utf-8", "replace")

    def close(self) -> None:
        if self.vision is not None:
            self.vision.close()
            self.vision = None
        if self.handle:
            self.loras.clear()  # llama.cpp frees a model's adapters with the model
            C.llama_model_free(self.handle)
            self.handle = None
