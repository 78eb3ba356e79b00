"""A queued prompt's second look at the prefix cache.

A request's cache lookup is made once, before it is submitted (engine/loop/submission.py:
off the event loop, as a disk hit reads a file). A request that then waits in the queue
(agents sent at once, more than the slots) keeps what that lookup found, so the states
stored while it waited, the head its neighbours share above all, would serve it only
from the slot that computed them, and only while nobody else takes that slot. So before
a step that may admit, each of the queue's first few sequences whose lookup predates
states stored since looks again, in the tiers under the cache's lock only (RAM: no I/O
on the engine thread), and keeps the longer of the two hits.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice

from cache import PrefixCache
from engine.sequence import Sequence
from engine.thread.admission import RANKED_PER_SLOT
from engine.thread.placement import find_usable
from engine.thread.plan import SchedulerConfig


def look_again(waiting: Iterable[Sequence], cache: PrefixCache, config: SchedulerConfig) -> int:
    """Give each of the queue's first sequences the longest prefix the cache's memory holds
    now, where states were stored since its last lookup. Sequences that made no lookup
    (a session's own slot holds them, prompt log-probabilities, n > 1's later choices)
    and preempted ones (their tokens run past the prompt) are left as they are. Returns
    how many found a longer prefix."""
    stored, found = cache.stored, 0
    for seq in islice(waiting, RANKED_PER_SLOT * config.num_slots):  # the ones ranked
        if seq.cache_seen < 0 or seq.cache_seen == stored or seq.num_output_tokens > 0:
            continue
        seq.cache_seen = stored
        hit = find_usable(cache, seq.tokens[: seq.num_prompt_tokens], seq.salt, config, held=True)
        before = seq.cache_hit.num_matched if seq.cache_hit is not None else 0
        if hit is not None and hit.num_matched > before:
            seq.cache_hit = hit
            seq.lookup_tier, seq.lookup_tokens = hit.tier, hit.num_matched
            found += 1
    return found
