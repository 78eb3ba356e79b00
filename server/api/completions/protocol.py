"""OpenAI legacy Completions' request model."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from server.api.common import Prompt, SamplingExtras
from server.api.constraints import ConstraintFields
from server.errors import BadRequest, Unsupported


class CompletionRequest(ConstraintFields, SamplingExtras):
    model: str
    prompt: Prompt
    max_tokens: Annotated[int, Field(ge=0)] | None = 16
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    echo: bool = False
    # llama-server's reply extras (server/serving/timings.py): the generated token ids in
    # each choice's `tokens`, and the `timings` object
    return_tokens: bool = False
    timings_per_token: bool = False

    def refuse_unsupported(self) -> None:
        extra = self.model_extra or {}
        if extra.get("suffix") not in (None, ""):
            raise Unsupported("suffix", "insertion is not implemented")
        best_of = extra.get("best_of")
        if best_of is not None and best_of != self.n:
            raise Unsupported("best_of", "only best_of equal to n is available")
        if self.echo and self.logprobs is not None and self.stream:
            raise Unsupported("echo", "echo with logprobs is not implemented for streams yet")
        if self.max_tokens == 0 and not self.echo:
            raise BadRequest(
                "'max_tokens' must be at least 1 unless echo is true", param="max_tokens"
            )
        self.read_constraint((("grammar", self.grammar is not None),))

    def record_grammar(self) -> str | None:
        other = self.constraint  # (JSON constraints too: no chat plan here)
        return self.grammar if other is None else other.gbnf
