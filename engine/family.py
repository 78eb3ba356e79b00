"""What kind of model was loaded, and what that allows: the family probe's result.

`ModelFamily` is filled in at load from llama.cpp's own answers (engine/llama/model.py,
`Model.family()`); everything here is plain data and the rules that follow from it, so
the scheduler, the cache and the server ask one place what a model's memory permits.

Memory kinds (llama.cpp's memory modules):
- "attention": a KV cell per position; a sequence can be cut back at any position.
- "sliding_window": the same, with some layers attending only to the last n_swa
  positions. kvserve keeps llama.cpp's full-size window cache (swa_full), so a slot's own
  cells can be cut anywhere; a state that went through a blob holds only the window's
  last cells (engine/thread/slots.py window_floor): a warm reply never attends over cells that
  are not there (docs/models.md "Model families").
- "recurrent" (Mamba, RWKV): one state per sequence, the sum of every token so far. It
  cannot be cut back: a stored state is valid for exactly the tokens it was made from.
- "hybrid" (LFM2, Granite 4, Qwen3.5, Jamba, Qwen3-Next): attention layers beside
  recurrent ones; the recurrent part rules, so it is "whole state" like a recurrent one.
"""

from __future__ import annotations

from dataclasses import dataclass

# llama.h's enum llama_ftype: what general.file_type says of the weights.
_FTYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0",
    38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0", 41: "Q2_0",
}  # fmt: skip
GUESSED_FTYPE = 1024  # llama.h: LLAMA_FTYPE_GUESSED, or'ed in when the file did not say


def ftype_name(ftype: int) -> str | None:
    """llama.cpp's name of a general.file_type value, or None for one it does not define."""
    return _FTYPES.get(ftype & ~GUESSED_FTYPE)


def quantization_name(ftype: int) -> str:
    name = ftype_name(ftype)
    return name if name is not None else f"ftype {ftype}"


class UnsupportedModelError(ValueError):
    """The file is a model kvserve cannot serve (an encoder-decoder or a diffusion
    model): refused at load with one clear line, never at the first decode."""


@dataclass(frozen=True, slots=True)
class ModelFamily:
    architecture: str  # general.architecture ("llama", "gemma3", "mamba", "lfm2", ...)
    n_swa: int = 0  # sliding window in tokens; 0: none
    recurrent: bool = False
    hybrid: bool = False
    has_encoder: bool = False
    diffusion: bool = False
    n_ctx_train: int = 0
    n_params: int = 0
    n_layer: int = 0
    n_embd: int = 0
    size_bytes: int = 0
    quantization: str = ""

    @property
    def memory(self) -> str:
        """attention / sliding_window / recurrent / hybrid (see the module docstring)."""
        if self.hybrid:
            return "hybrid"
        if self.recurrent:
            return "recurrent"
        return "sliding_window" if self.n_swa > 0 else "attention"

    @property
    def whole_state(self) -> bool:
        """A sequence's memory can only be kept whole, never cut back to a prefix: reuse
        must start from a state made from exactly a prefix of the prompt."""
        return self.recurrent or self.hybrid

    @property
    def blob_bound(self) -> bool:
        """A state that went through a blob (the cache, a copy) serves only prompts that
        extend it: a whole state, or a sliding window's (llama.cpp writes its window
        layers' cells for the last n_swa positions only: engine/thread/slots.py window_floor).
        The cache then keeps prefixes as checkpoints, and the engine saves states where
        prompts diverge."""
        return self.whole_state or self.n_swa > 0

    def refusal(self) -> str | None:
        """Why kvserve cannot serve this model, or None."""
        if self.has_encoder:
            return (
                f"it is an encoder-decoder model ({self.architecture}); kvserve serves "
                "decoder-only models"
            )
        if self.diffusion:
            return (
                f"it is a diffusion model ({self.architecture}); kvserve generates "
                "token by token, which a diffusion model does not"
            )
        return None

    def as_dict(self) -> dict[str, object]:
        """The probe as the server shows it (/v1/models, /api/show, /v1/status)."""
        return {
            "architecture": self.architecture,
            "memory": self.memory,
            "sliding_window": self.n_swa,
            "recurrent": self.recurrent,
            "hybrid": self.hybrid,
            "context_length_trained": self.n_ctx_train,
            "parameters": self.n_params,
            "layers": self.n_layer,
            "embedding_length": self.n_embd,
            "size_bytes": self.size_bytes,
            "quantization": self.quantization,
        }
