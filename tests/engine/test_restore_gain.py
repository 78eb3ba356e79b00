"""When a stored state is worth restoring over the prefix a slot already holds
(engine/thread/placement.py `restore_min_gain`), without a model."""

from __future__ import annotations

from cache import CacheHit
from engine.detokenizer import IncrementalDetokenizer
from engine.sequence import Sequence
from engine.thread.placement import COPY_MIN_TOKENS, restore_min_gain
from engine.thread.plan import checkpoint_tokens
from engine.thread.scheduler import Scheduler, SchedulerConfig
from engine.thread.slots import Drop, Restore
from engine.types import GenerateRequest


def seq_of(name: str, tokens: list[int]) -> Sequence:
    return Sequence(GenerateRequest(name, tuple(tokens)), None, IncrementalDetokenizer([b""]), None)


def per_slot(n_ctx_seq: int = 20_000) -> Scheduler:
    return Scheduler(SchedulerConfig(1, n_ctx_seq, n_ctx_seq, 64, 32, exact=False))


def finish(s: Scheduler, x: Sequence) -> None:
    """Prefill `x` whole and take it out: its prompt stays resident in its slot."""
    s.add(x)
    while not x.is_decoding:
        chunks, _ = s.schedule()
        for c in chunks:
            c.seq.num_computed += c.length
            if c.sample:
                c.seq.tokens.append(7)
    s.remove(x)


def test_the_gain_a_restore_needs_grows_with_the_state_and_stops_at_a_copys() -> None:
    assert restore_min_gain(64) == 1  # a short state: one token saved pays for it
    assert restore_min_gain(128) == 1
    assert restore_min_gain(1024) == 4
    assert restore_min_gain(16_384) == COPY_MIN_TOKENS  # never more than before


def head_then(tail: list[int]) -> list[int]:
    return list(range(1, 30)) + tail  # a shared head of 29 tokens (a system prompt)


def test_a_short_state_a_few_tokens_longer_than_the_slot_is_restored() -> None:
    # The slot holds the shared head; a stored state of an earlier prompt on the same
    # question agrees 7 tokens further: restoring it (about a millisecond) beats
    # computing 7 tokens (the bench's c=8 TTFT, issue 48).
    s = per_slot()
    finish(s, seq_of("a", head_then([100 + i for i in range(35)])))
    stored = head_then([200 + i for i in range(7)] + [300 + i for i in range(92)])
    x = seq_of("x", head_then([200 + i for i in range(7)] + [400 + i for i in range(28)]))
    x.cache_hit = CacheHit(tuple(stored), b"state", 36, "ram")
    s.add(x)
    _, kv = s.schedule()
    assert kv.ops == [Drop(0), Restore(x, 0, kv.ops[1].hit, 36)]  # type: ignore[union-attr]
    assert x.num_cached == 36 and x.hit_source == "ram"


def test_a_long_state_must_save_more_than_a_few_tokens() -> None:
    # A 4,096-token state agrees 7 tokens past the slot: writing it all is not worth 7
    # tokens; 16 more are (restore_min_gain(4096) == 16).
    s = per_slot()
    finish(s, seq_of("a", head_then([100 + i for i in range(35)])))
    for extra, restored in ((7, False), (16, True)):
        agree = head_then([200 + i for i in range(extra)])
        stored = agree + [300 + i for i in range(4096 - len(agree))]
        x = seq_of(f"x{extra}", agree + [500 + i for i in range(40)])
        x.cache_hit = CacheHit(tuple(stored), b"state", len(agree), "ram")
        s.add(x)
        _, kv = s.schedule()
        assert any(isinstance(op, Restore) for op in kv.ops) is restored
        assert x.num_cached == (len(agree) if restored else 29)
        s.remove(x)


def test_checkpoints_keep_their_64_token_alignment_under_a_finer_block() -> None:
    assert checkpoint_tokens(16) == 64 and checkpoint_tokens(64) == 64
    assert checkpoint_tokens(48) == 96  # a multiple of the block, so a lookup finds it
    assert checkpoint_tokens(256) == 256
