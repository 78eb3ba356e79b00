"""OpenAI Embeddings' request model."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from server.api.common import Prompt, RequestModel


class EmbeddingRequest(RequestModel):
    model: str
    input: Prompt
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
    user: str | None = None
