"""`StepCounters`: every counter of the engine thread, in one object.

Prometheus counters must never go backwards, so these outlive what counts into them:
the Engine makes one `StepCounters` and hands the same object to every worker,
scheduler and slot table it builds, after a rebuild of a dead engine thread
(engine/thread/recovery.py) and after an unload and a reload alike.

Threads: written by the engine thread only; `stats()` copies them for other threads.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from cache import CacheStats
from engine.types import EngineStats, SlotView

# Bucket bounds of the tokens-per-step histogram.
BATCH_SIZE_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)


@dataclass(slots=True)
class StepCounters:
    num_steps: int = 0
    num_prefill_tokens: int = 0
    num_generated_tokens: int = 0
    num_decode_failures: int = 0
    num_restore_failures: int = 0
    num_reused_tokens: int = 0
    num_drafted_tokens: int = 0  # speculative decoding: guesses verified
    num_accepted_tokens: int = 0  # and kept
    num_preemptions: int = 0  # sequences sent back to the queue for KV space (scheduler)
    num_reclaims: int = 0  # idle sessions' slots taken for others (slot table)
    num_decode_aborts: int = 0  # decodes interrupted past limits.decode_s
    num_timeouts: int = 0  # sequences ended by a time limit
    num_rebuilds: int = 0  # times the engine thread died and was rebuilt
    num_refused_drops: int = 0  # cuts of a sequence llama.cpp refused (recurrent memory)
    num_checkpoints: int = 0  # whole-state memories: states saved where prompts diverged
    num_lane_writes: int = 0  # outputs a stream's lane wrote (engine/thread/lanes.py)
    hits: dict[str, int] = field(default_factory=dict)  # (kind) cold / partial / exact / session
    hit_sources: dict[str, int] = field(default_factory=dict)  # none / slot / ram / disk
    # Requests that found a stored prefix and computed cold anyway, by why (placement.py).
    cold_reasons: dict[str, int] = field(default_factory=dict)
    batch_size_counts: list[int] = field(default_factory=lambda: [0] * (len(BATCH_SIZE_BOUNDS) + 1))
    batch_size_sum: int = 0


def snapshot(
    c: StepCounters,
    *,
    num_slots: int,
    num_running: int,
    num_waiting: int,
    kv_cells_used: int,
    num_sessions_pinned: int,
    last_batch_size: int,
    cache: CacheStats | None,
    slots: tuple[SlotView, ...] = (),
) -> EngineStats:
    """The counters with the engine's gauges, for another thread: reads plain ints and
    copies of the dicts (a copy is one C call under the GIL; iterating a dict the engine
    thread grows could fail mid-way). Every int counter goes by its own name, so a new
    counter needs a field in EngineStats and nothing here."""
    hits, sources, cold = c.hits.copy(), c.hit_sources.copy(), c.cold_reasons.copy()
    counts: dict[str, int] = {
        f.name: value for f in fields(c) if isinstance(value := getattr(c, f.name), int)
    }
    return EngineStats(
        num_slots=num_slots,
        num_running=num_running,
        num_waiting=num_waiting,
        kv_cells_used=kv_cells_used,
        last_batch_size=last_batch_size,
        num_sessions_pinned=num_sessions_pinned,
        hits=tuple(sorted(hits.items())),
        hit_sources=tuple(sorted(sources.items())),
        cold_reasons=tuple(sorted(cold.items())),
        cache=cache,
        batch_size_bounds=BATCH_SIZE_BOUNDS,
        batch_size_counts=tuple(c.batch_size_counts),
        slots=slots,
        **counts,
    )
