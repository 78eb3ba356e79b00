"""`[responses]`: stored Responses-API responses, and the secret that seals the reasoning
a stateless client carries between turns (read by server/api/responses/)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic_core import PydanticCustomError

# A shorter secret could be guessed from the key id every blob carries (a digest of it).
MIN_SEAL_SECRET = 16


def _seal_secret(value: str) -> str:
    if value and len(value) < MIN_SEAL_SECRET:
        raise PydanticCustomError("secret", "must be empty or at least {n} characters long",
                                  {"n": MIN_SEAL_SECRET})  # fmt: skip
    return value


@pydantic_dataclass(frozen=True)
class ResponsesSection:
    """Stored Responses-API responses (store: true); in the shared Redis when
    `[cache] shared_url` is set. `seal_secret` signs the `reasoning.encrypted_content`
    blobs (server/api/responses/sealed.py): the same value on every replica lets any of
    them read a blob another made; empty, a key file in the disk cache's directory
    (made on first use) keeps them readable across restarts of this server."""

    max_stored: Annotated[int, Field(ge=0)] = 1000  # per API key
    ttl_s: Annotated[float, Field(gt=0)] = 3600.0
    seal_secret: Annotated[str, AfterValidator(_seal_secret)] = ""
