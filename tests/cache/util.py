"""Shared helpers for the cache tests: deterministic states and cache construction."""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

from cache import CacheConfig, PrefixCache
from cache.disk import DiskTier

BLOCK = 4  # small blocks keep token lists readable


def state_for(tokens: Sequence[int], size: int = 100) -> bytes:
    """A state blob that is a pure function of the tokens, so any hit can be checked."""
    digest = hashlib.blake2b(array("i", tokens).tobytes(), digest_size=32).digest()
    return (digest * (size // 32 + 1))[:size]


def config(**overrides: object) -> CacheConfig:
    base: dict[str, object] = {"block_tokens": BLOCK, "min_tokens": BLOCK, "writer_queue": 64}
    base.update(overrides)
    return CacheConfig(**base)  # type: ignore[arg-type]


def saved(cache: PrefixCache, *token_lists: Sequence[int], salt: str = "", size: int = 100) -> None:
    """Save each list with its own state and wait until the writer has stored them."""
    for tokens in token_lists:
        assert cache.save(tokens, state_for(tokens, size), salt=salt)
        assert cache.flush(timeout=30)


def disk_of(cache: PrefixCache) -> DiskTier:
    """The cache's disk tier (the test configured one)."""
    disk = cache.tier("disk")
    assert isinstance(disk, DiskTier)
    return disk
