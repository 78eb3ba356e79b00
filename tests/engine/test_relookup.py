"""A queued prompt's second look at the cache (engine/thread/relookup.py), without a
model: states stored while it waited reach it from RAM, never from a blocking tier, and
only prompts whose lookup predates them look again."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from cache import PrefixCache
from engine.detokenizer import IncrementalDetokenizer
from engine.sequence import Sequence
from engine.thread.relookup import look_again
from engine.thread.scheduler import SchedulerConfig
from engine.types import GenerateRequest
from tests.cache.util import config, saved

HEAD = list(range(100, 140))  # the head queued agents share
CONFIG = SchedulerConfig(2, 2000, 1000, 512, 256, exact=False)


def queued(name: str, tokens: list[int], seen: int, salt: str = "") -> Sequence:
    request = GenerateRequest(name, tuple(tokens), cache_salt=salt)
    seq = Sequence(request, None, IncrementalDetokenizer([b""]), None)
    seq.cache_seen = seen
    return seq


@pytest.fixture
def cache() -> Iterator[PrefixCache]:
    store = PrefixCache(config(), "relookup")
    yield store
    store.close()


def test_a_state_stored_while_a_prompt_waits_reaches_it(cache: PrefixCache) -> None:
    waiting = queued("w", HEAD + [1, 2, 3, 4, 5], seen=cache.stored)  # looked up: nothing
    before = cache.stats()
    saved(cache, HEAD)  # the neighbour that ran first stored its head
    assert look_again([waiting], cache, CONFIG) == 1
    assert waiting.cache_hit is not None and waiting.cache_hit.num_matched == len(HEAD)
    assert (waiting.lookup_tier, waiting.lookup_tokens) == ("ram", len(HEAD))
    assert waiting.cache_seen == cache.stored
    after = cache.stats()  # a second look is not a lookup of its own: counted once, at submission
    assert (after.ram.hits, after.ram.misses) == (before.ram.hits, before.ram.misses)


def test_only_prompts_whose_lookup_predates_a_store_look_again(cache: PrefixCache) -> None:
    saved(cache, HEAD)
    current = queued("current", HEAD + [7], seen=cache.stored)  # saw the head already
    never = queued("never", HEAD + [8], seen=-1)  # made no lookup (a session's own slot)
    preempted = queued("preempted", HEAD + [9], seen=0)
    preempted.tokens.append(3)  # it generated a token before it was preempted
    assert look_again([current, never, preempted], cache, CONFIG) == 0
    assert all(s.cache_hit is None for s in (current, never, preempted))


def test_a_second_look_finds_only_its_own_tenants_and_adapters_states(cache: PrefixCache) -> None:
    saved(cache, HEAD, salt="tenant-a")
    other = queued("b", HEAD + [1], seen=0, salt="tenant-b")
    own = queued("a", HEAD + [1], seen=0, salt="tenant-a")
    adapted = queued("lora", HEAD + [1], seen=0, salt="tenant-a")
    adapted.request = dataclasses.replace(adapted.request, lora=(("style", 1.0),))
    assert look_again([other, adapted, own], cache, CONFIG) == 1
    assert other.cache_hit is None and adapted.cache_hit is None and own.cache_hit is not None


def test_a_second_look_keeps_the_longer_hit(cache: PrefixCache) -> None:
    saved(cache, HEAD[:20], HEAD)
    first = cache.lookup(HEAD + [1])
    assert first is not None
    seq = queued("w", HEAD + [1], seen=0)
    seq.cache_hit = first  # its own lookup found the longest already
    assert look_again([seq], cache, CONFIG) == 0 and seq.cache_hit is first


def test_a_second_look_reads_no_file(tmp_path: Path) -> None:
    # A state only on disk (too big for RAM) is left to the lookup at submission.
    store = PrefixCache(config(ram_bytes=10, disk_dir=str(tmp_path)), "relookup")
    try:
        saved(store, HEAD)
        assert store.lookup(HEAD + [1]) is not None  # the full lookup reads it
        assert store.lookup(HEAD + [1], held=True) is None
        seq = queued("w", HEAD + [1], seen=0)
        assert look_again([seq], store, CONFIG) == 0 and seq.cache_hit is None
    finally:
        store.close()
