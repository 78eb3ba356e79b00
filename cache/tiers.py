"""The cache's tiers, in the order a lookup asks them: the ones this process alone writes
(indexed), fastest first, then the ones other replicas write too. Each opener builds its
tier from `[cache]`, or returns None where it is not configured (cache/tier.py).

A new tier is a module implementing `cache.tier.Tier` with an `open_tier`, and one line
here (its settings, if any, in CacheConfig: cache/types.py).
"""

from __future__ import annotations

from cache import disk, ram, shared
from cache.tier import Opener

TIERS: tuple[Opener, ...] = (
    ram.open_tier,  # in the process: every cache has one
    disk.open_tier,  # disk_dir: one file per entry, warm after a restart
    shared.open_tier,  # shared_url: Redis, shared by the replicas
)
