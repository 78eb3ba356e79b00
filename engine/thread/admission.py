"""Admission policy when sequences outnumber slots: who goes next, and who waits for a
head another sequence is computing. Pure policy, no llama.cpp; engine thread only.

Measured on the agents workload (bench/agents.py: 16 agents on 4 slots sharing one tool
catalogue; docs/benchmarks.md "Agents that outnumber slots"):
- a cold burst sharing a head computed it once per slot (3 x 810 tokens again); now the
  followers wait for the one prefilling it and copy it (`waits_for_shared_head`);
- on a sliding-window or recurrent model (bench/agent_replay.py, 4 Claude Code sessions
  on 2 slots of Gemma 3 270M) two sessions starting together computed their 12k-token
  head twice: the one prefilling it now stops where the prompts part, so that the
  followers copy its state there (`hold_for`);
- a warm next turn waited in arrival order behind cold tasks; now the least prompt left
  to compute goes first, aging bounding every wait (`rank_waiting`).
"""

from __future__ import annotations

from bisect import insort
from collections import deque
from collections.abc import Iterable

from engine.sequence import Sequence
from engine.thread.placement import reusable
from engine.thread.plan import SchedulerConfig, common_prefix
from engine.thread.slots import SlotTable

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
    blob_bound = config.whole_state or config.n_swa > 0
    if blob_bound and config.exact:
        # Exact reuse starts only from states at row blocks and prompt boundaries
        # (placement.py `reusable`); a hold point between them would serve nobody.
        return False
    leader, longest = None, 0
    for s in running:
        if s.salt == seq.salt and not s.prompt_done:
            shared = common_prefix(s.tokens[: s.num_prompt_tokens], seq.tokens)
            if shared > longest:
                leader, longest = s, shared
    if leader is None or longest < SHARED_HEAD_MIN_TOKENS:
        return False
    if longest - reusable_now(seq, running, slots, config) < SHARED_HEAD_MIN_TOKENS:
        return False
    return not blob_bound or hold_for(leader, seq, longest, config)


def hold_for(leader: Sequence, seq: Sequence, shared: int, config: SchedulerConfig) -> bool:
    """Make `leader` stop its prefill where `seq`'s prompt parts from it, so that `seq`
    can copy its state there; False if it is already past that point. A copy of a
    window's or a recurrent memory's state goes through a blob that serves only prompts
    extending it (slots.window_floor): it must be taken where the leader stands. The stop
    is one of the leader's checkpoints (its chunks end there, and its state is saved
    there too: postprocess.py `save_long_prefill`); `seq` computes at least its last
    prompt token itself (placement.py `reuse_limit`)."""
    at = min(shared, len(seq.tokens) - config.tail_rows)
    if at <= leader.num_computed:
        return False
    if at not in leader.checkpoints:
        insort(leader.checkpoints, at)
    return True


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
