"""Admission policy when sequences outnumber slots: who goes next, and who waits for a
head another sequence is computing. Pure policy, no llama.cpp; engine thread only.

Measured on the agents workload (bench/agents.py: 16 agents on 4 slots sharing one tool
catalogue; docs/benchmarks.md "Agents that outnumber slots"):
- a cold burst sharing a head computed it once per slot (3 x 810 tokens again); now the
  followers wait for the one prefilling it and copy it (`waits_for_shared_head`);
- a warm next turn waited in arrival order behind cold tasks; now the least prompt left
  to compute goes first, aging bounding every wait (`rank_waiting`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from engine.placement import reusable
from engine.plan import SchedulerConfig, common_prefix
from engine.sequence import Sequence
from engine.slots import SlotTable

# A sequence that would get at least this many more tokens of its prompt by waiting for
# one still prefilling them waits, then copies them, rather than computing the same head
# in another slot in the same steps.
SHARED_HEAD_MIN_TOKENS = 64

# Aging: a sequence overtaken this many times per slot goes first, in arrival order.
OVERTAKE_LIMIT_PER_SLOT = 2
# Only the head of the queue is ranked (each sequence ranked costs prefix comparisons).
RANKED_PER_SLOT = 4


def reusable_now(
    seq: Sequence, running: Iterable[Sequence], slots: SlotTable, config: SchedulerConfig
) -> int:
    """The longest prefix of `seq` held now: its cache hit, a resident slot, or a
    running sequence's reusable KV (what placement may give it)."""
    salt, tokens = seq.salt, seq.tokens
    have = seq.cache_hit.num_matched if seq.cache_hit is not None else 0
    for r in slots.resident.values():
        if r.salt == salt:
            have = max(have, common_prefix(r.tokens, tokens))
    for s in running:
        if s.salt == salt:
            have = max(have, common_prefix(reusable(s, config), tokens))
    return have


def waits_for_shared_head(
    seq: Sequence, running: list[Sequence], slots: SlotTable, config: SchedulerConfig
) -> bool:
    """A running sequence is still prefilling a head of `seq`'s prompt at least
    SHARED_HEAD_MIN_TOKENS longer than what `seq` can start from now: `seq` waits and
    copies it once it is there. The one prefilling it is running, so it gets there; a
    preempted or finished one no longer holds anyone back."""
    if not config.keeps_prefixes or seq.request.prompt_logprobs is not None:
        return False
    if config.whole_state or config.n_swa:
        # A copy of a running sequence's KV goes through a blob, which serves only prompts
        # that extend it (slots.window_floor): waiting for a head to copy would gain nothing.
        return False
    longest = max(
        (
            common_prefix(s.tokens[: s.num_prompt_tokens], seq.tokens)
            for s in running
            if s.salt == seq.salt and not s.prompt_done
        ),
        default=0,
    )
    if longest < SHARED_HEAD_MIN_TOKENS:
        return False
    return longest - reusable_now(seq, running, slots, config) >= SHARED_HEAD_MIN_TOKENS


def rank_waiting(
    waiting: deque[Sequence], running: list[Sequence], slots: SlotTable, config: SchedulerConfig
) -> None:
    """Order the head of the queue for admission: overdue and preempted sequences first
    (in arrival order), then the least prompt left to compute after what it can reuse."""
    if len(waiting) < 2:
        return
    limit = OVERTAKE_LIMIT_PER_SLOT * config.num_slots
    head = [waiting.popleft() for _ in range(min(RANKED_PER_SLOT * config.num_slots, len(waiting)))]

    def rank(seq: Sequence) -> tuple[int, float, int]:
        if seq.num_overtaken >= limit or seq.num_output_tokens > 0:
            return (0, seq.arrival, 0)
        return (1, 0.0, len(seq.tokens) - reusable_now(seq, running, slots, config))

    head.sort(key=rank)
    waiting.extendleft(reversed(head))


def count_overtakes(waiting: Iterable[Sequence], admitted: list[Sequence]) -> None:
    """Each waiting sequence is overtaken by every later arrival admitted before it."""
    for seq in waiting:
        seq.num_overtaken += sum(a.arrival > seq.arrival for a in admitted)
