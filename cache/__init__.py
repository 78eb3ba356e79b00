"""The tiered KV prefix cache: an ordered list of tiers (RAM, then disk, then a store
the replicas share: cache/tiers.py), keyed by chained hashes of token blocks.

A leaf package (the standard library, and redis-py for the tier that replicas share:
cache/shared.py). It stores opaque KV state blobs with the exact token ids they cover;
the engine decides what to save and how to restore it.
"""

from cache.budget import CacheBudget
from cache.keys import model_fingerprint, namespace
from cache.redis_tier import redis_client, redis_peer
from cache.shared import recording_calls
from cache.store import PrefixCache
from cache.types import CacheConfig, CacheHit, CacheStats, StoreCall, TierStats

__all__ = [
    "CacheBudget",
    "CacheConfig",
    "CacheHit",
    "CacheStats",
    "PrefixCache",
    "StoreCall",
    "TierStats",
    "model_fingerprint",
    "namespace",
    "recording_calls",
    "redis_client",
    "redis_peer",
]
