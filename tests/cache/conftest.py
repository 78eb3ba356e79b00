from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cache import PrefixCache
from tests.cache.util import config

MakeCache = Callable[..., PrefixCache]


@pytest.fixture
def make_cache(tmp_path: Path) -> Iterator[MakeCache]:
    """Build caches (disk tier under tmp_path unless disk_dir="") and close them after."""
    caches: list[PrefixCache] = []

    def build(namespace: str = "ns", **overrides: object) -> PrefixCache:
        overrides.setdefault("disk_dir", str(tmp_path / "kv"))
        cache = PrefixCache(config(**overrides), namespace)
        caches.append(cache)
        return cache

    yield build
    for cache in caches:
        cache.close(timeout=30)
