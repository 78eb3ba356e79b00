"""`SpecialTokens`: the ids of a vocabulary's special tokens, as llama.cpp names them.

llama-server's users script against these (a FIM prompt built by hand, an end token to
watch for); kvserve shows them in `/v1/models` meta and `/props` (server/api/kvserve)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class SpecialTokens:
    """Each id as `llama_vocab_<name>` returns it; None where the vocabulary has none
    (llama.cpp's LLAMA_TOKEN_NULL, -1)."""

    bos: int | None = None
    eos: int | None = None
    eot: int | None = None  # end of turn
    sep: int | None = None
    nl: int | None = None
    pad: int | None = None
    fim_pre: int | None = None  # fill-in-the-middle: prefix, suffix, middle ...
    fim_suf: int | None = None
    fim_mid: int | None = None
    fim_pad: int | None = None  # ... and the repository-level ones
    fim_rep: int | None = None
    fim_sep: int | None = None

    @classmethod
    def from_ids(cls, ids: dict[str, int]) -> SpecialTokens:
        """From llama.cpp's ids by name, a negative id (none) as None."""
        return cls(**{name: (i if i >= 0 else None) for name, i in ids.items()})

    def as_dict(self) -> dict[str, int | None]:
        return asdict(self)
