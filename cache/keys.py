"""Hashing: the model fingerprint, the namespace, and the chained block keys.

A prompt's key chain is h_0 = seed(namespace, salt), h_i = blake2b(h_{i-1} || block_i)
over `block_tokens`-sized blocks of int32 little-endian token ids. Each h_i names the
whole prefix up to the end of block i, so the longest stored prefix of a prompt is found
by hashing its blocks once. The salt is in the seed: tenants with different salts never
share a key, so one cannot probe for another's prompts.
"""

from __future__ import annotations

import hashlib
import os
import sys
from array import array
from collections.abc import Sequence

DIGEST_BYTES = 16  # 128-bit keys: collisions are not a practical concern
_FINGERPRINT_SPAN = 1 << 20  # bytes hashed at each end of the model file


def token_bytes(tokens: Sequence[int]) -> bytes:
    """Token ids as int32 little-endian bytes (the layout of keys and of disk files)."""
    packed = array("i", tokens)
    if packed.itemsize != 4:  # pragma: no cover - C int is 32-bit on every target we run
        raise RuntimeError("C int is not 32 bits on this platform")
    if sys.byteorder == "big":  # pragma: no cover
        packed.byteswap()
    return packed.tobytes()


def tokens_from_bytes(data: bytes | memoryview) -> tuple[int, ...]:
    packed = array("i")
    packed.frombytes(data)
    if sys.byteorder == "big":  # pragma: no cover
        packed.byteswap()
    return tuple(packed)


def seed(namespace: str, salt: str) -> bytes:
    """h_0 of every chain: length-prefixed, so ("ab", "c") and ("a", "bc") differ."""
    h = hashlib.blake2b(digest_size=DIGEST_BYTES, person=b"kvserve-seed")
    for part in (namespace.encode(), salt.encode()):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.digest()


def block_hashes(tokens: Sequence[int], block_tokens: int, chain_seed: bytes) -> list[bytes]:
    """h_1..h_k for the k full blocks of `tokens` (a partial last block is not hashed)."""
    num_blocks = len(tokens) // block_tokens
    data = memoryview(token_bytes(tokens[: num_blocks * block_tokens]))
    step = 4 * block_tokens
    hashes: list[bytes] = []
    prev = chain_seed
    for i in range(num_blocks):
        h = hashlib.blake2b(prev, digest_size=DIGEST_BYTES, person=b"kvserve-block")
        h.update(data[i * step : (i + 1) * step])
        prev = h.digest()
        hashes.append(prev)
    return hashes


def entry_key(chain_seed: bytes, tokens: Sequence[int]) -> str:
    """The name of an entry: one hex digest over the seed and all its tokens."""
    h = hashlib.blake2b(chain_seed, digest_size=DIGEST_BYTES, person=b"kvserve-entry")
    h.update(token_bytes(tokens))
    return h.hexdigest()


def model_fingerprint(path: str) -> str:
    """Cheap and stable: file size plus blake2b of the first and last MiB, and the
    basename. Reads at most 2 MiB however large the model is."""
    size = os.path.getsize(path)
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    with open(path, "rb") as f:
        h.update(f.read(_FINGERPRINT_SPAN))
        if size > _FINGERPRINT_SPAN:
            f.seek(max(size - _FINGERPRINT_SPAN, _FINGERPRINT_SPAN))
            h.update(f.read(_FINGERPRINT_SPAN))
    return f"{os.path.basename(path)}:{size}:{h.hexdigest()}"


def namespace(*parts: object) -> str:
    """A short hex name for the model fingerprint and the KV-layout parameters (n_ctx,
    type_k/type_v, LoRA...) the engine passes: states saved under one layout must never
    load under another. repr() keeps 1 and "1" apart; the separator keeps parts apart."""
    h = hashlib.blake2b(digest_size=8, person=b"kvserve-ns")
    h.update("\x1f".join(repr(p) for p in parts).encode())
    return h.hexdigest()
