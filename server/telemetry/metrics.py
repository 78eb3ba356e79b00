"""Prometheus metrics on a registry owned by the app (served at GET /metrics by
server/api/kvserve/metrics.py).

Two sources. Request-level metrics (latencies, requests, tokens) are observed by the
HTTP layer as outputs reach it (`ServerMetrics`, fed by `server.telemetry.access`). Engine-level
gauges and counters are read from each engine's plain `EngineStats` at scrape time
(`EngineCollector`), so nothing is counted twice and the engine never sees
prometheus_client. Every series carries the served model's id in `model`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from engine.client import EngineStats
from server.telemetry.recent import RecentTraffic

if TYPE_CHECKING:
    from server.models.served import ModelRegistry


_LATENCY = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_ITL = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.1, 0.25, 0.5, 1.0)
_E2E = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class ServerMetrics:
    """The request-level metrics, registered on the app's registry."""

    def __init__(self, registry: CollectorRegistry):
        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, ["model"], buckets=buckets, registry=registry)

        def counter(name: str, doc: str, labels: tuple[str, ...] = ("model",)) -> Counter:
            return Counter(name, doc, list(labels), registry=registry)

        self.ttft = histogram(
            "kvserve_time_to_first_token_seconds",
            "From the request's arrival to its first generated token reaching the HTTP layer.",
            _LATENCY,
        )
        self.itl = histogram(
            "kvserve_inter_token_latency_seconds",
            "Between consecutive generated tokens of one sequence, at the HTTP layer.",
            _ITL,
        )
        self.e2e = histogram(
            "kvserve_e2e_request_latency_seconds",
            "From the request's arrival to its last byte sent (generation requests).",
            _E2E,
        )
        self.queue_wait = histogram(
            "kvserve_queue_wait_seconds",
            "From a sequence's submission to the engine until it first got a slot.",
            _LATENCY,
        )
        self.prefill = histogram(
            "kvserve_prefill_seconds",
            "From a sequence's first step until its whole prompt was in the KV cache.",
            _LATENCY,
        )
        self.requests = counter(
            "kvserve_requests", "HTTP requests answered.", ("model", "endpoint", "status")
        )
        self.prompt_tokens = counter("kvserve_prompt_tokens", "Prompt tokens of requests.")
        self.cached_tokens = counter(
            "kvserve_cached_prompt_tokens", "Prompt tokens reused from the KV cache."
        )
        self.generated_tokens = counter(
            "kvserve_generated_tokens", "Completion tokens of requests."
        )
        self.cancelled = counter(
            "kvserve_requests_cancelled",
            "Generation requests cut short: the client left, or shutdown's grace ran out.",
        )
        self.rejected = counter(
            "kvserve_requests_rejected", "Requests refused with 429 (every slot and queue full)."
        )
        # Not a Prometheus series: the status page's short history (server/telemetry/recent.py).
        self.recent = RecentTraffic()


class EngineCollector(Collector):
    """Each engine's `EngineStats`, turned into metrics at scrape time."""

    def __init__(self, models: ModelRegistry):
        self.models = models

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}

        def add(kind: type, name: str, doc: str, model: str, value: float) -> None:
            family = families.get(name)
            if family is None:
                family = families[name] = kind(name, doc, labels=["model"])
            family.add_metric([model], value)  # type: ignore[union-attr]

        for served in self.models:
            stats = served.engine.stats()
            if stats is None:  # still loading
                continue
            for name, (doc, value) in _gauges(stats).items():
                add(GaugeMetricFamily, name, doc, served.id, value)
            for name, (doc, value) in _counters(stats).items():
                add(CounterMetricFamily, name, doc, served.id, value)
            _batch_histogram(families, served.id, stats)
            for metric in cache_and_session_metrics(served.id, stats):
                if metric.name in families:
                    families[metric.name].samples.extend(metric.samples)
                else:
                    families[metric.name] = metric
        yield from families.values()


def _gauges(s: EngineStats) -> dict[str, tuple[str, float]]:
    return {
        "kvserve_slots_total": ("Sequence slots of the engine.", s.num_slots),
        "kvserve_slots_in_use": ("Slots held by running sequences.", s.num_running),
        "kvserve_slots_free": ("Slots without a running sequence.", s.num_slots - s.num_running),
        "kvserve_queue_depth": ("Sequences waiting for a slot.", s.num_waiting),
        "kvserve_kv_cells_used": ("KV cache cells in use.", s.kv_cells_used),
        "kvserve_batch_tokens": ("Tokens in the last llama_decode.", s.last_batch_size),
    }


def _counters(s: EngineStats) -> dict[str, tuple[str, float]]:
    return {
        "kvserve_engine_steps": ("llama_decode calls of the step loop.", s.num_steps),
        "kvserve_prefilled_tokens": ("Prompt tokens computed (not reused).", s.num_prefill_tokens),
        "kvserve_sampled_tokens": ("Tokens sampled by the engine.", s.num_generated_tokens),
        "kvserve_preemptions": ("Sequences preempted for KV space.", s.num_preemptions),
        "kvserve_decode_failures": ("Failed llama_decode calls.", s.num_decode_failures),
        "kvserve_decode_aborts": (
            "llama_decode calls interrupted past the decode time limit.", s.num_decode_aborts
        ),
        "kvserve_request_timeouts": (
            "Sequences ended by a per-request time limit.", s.num_timeouts
        ),
        "kvserve_lane_writes": (
            "Streamed outputs written to the client by the engine thread (a stream's lane).",
            s.num_lane_writes,
        ),
        "kvserve_engine_rebuilds": (
            "Times the engine thread died and was rebuilt in place.", s.num_rebuilds
        ),
        "kvserve_spec_drafted_tokens": (
            "Speculative decoding: draft tokens verified.",
            s.num_drafted_tokens,
        ),
        "kvserve_spec_accepted_tokens": (
            "Speculative decoding: draft tokens accepted.",
            s.num_accepted_tokens,
        ),
    }


def _batch_histogram(families: dict[str, Metric], model: str, stats: EngineStats) -> None:
    """Tokens per llama_decode, from the engine's plain bucket counts."""
    if not stats.batch_size_bounds:
        return
    name = "kvserve_batch_size_tokens"
    family = families.get(name)
    if family is None:
        family = families[name] = HistogramMetricFamily(
            name, "Tokens per engine step (one llama_decode).", labels=["model"]
        )
    cumulative, buckets = 0, []
    for bound, count in zip(stats.batch_size_bounds, stats.batch_size_counts, strict=False):
        cumulative += count
        buckets.append((str(float(bound)), float(cumulative)))
    total = float(sum(stats.batch_size_counts))
    buckets.append(("+Inf", total))
    family.add_metric([model], buckets, sum_value=float(stats.batch_size_sum))  # type: ignore[attr-defined]


def cache_and_session_metrics(model: str, stats: EngineStats) -> Iterator[Metric]:
    """Sessions and the prefix cache, from one model's `stats` (labels: model first)."""

    def family(kind: type, name: str, doc: str, labels: tuple[str, ...] = ()) -> Metric:
        return kind(name, doc, labels=["model", *labels])  # type: ignore[no-any-return]

    per_model = {
        "kvserve_sessions_pinned": (
            GaugeMetricFamily, "Sessions holding a slot.", stats.num_sessions_pinned
        ),
        "kvserve_session_reclaims": (
            CounterMetricFamily, "Idle sessions' slots taken for others.", stats.num_reclaims
        ),
        "kvserve_cache_tokens_reused": (
            CounterMetricFamily, "Prompt tokens not prefilled.", stats.num_reused_tokens
        ),
        "kvserve_cache_restore_failures": (
            CounterMetricFamily, "Cached states that failed to load.", stats.num_restore_failures
        ),
        "kvserve_kv_refused_drops": (
            CounterMetricFamily,
            "Cuts of a sequence's KV llama.cpp refused (a recurrent memory): computed cold.",
            stats.num_refused_drops,
        ),
        "kvserve_cache_checkpoints": (
            CounterMetricFamily,
            "Recurrent and hybrid models: states saved where prompts were seen to diverge.",
            stats.num_checkpoints,
        ),
    }
    for name, (kind, doc, value) in per_model.items():
        metric = family(kind, name, doc)
        metric.add_metric([model], value)  # type: ignore[attr-defined]
        yield metric
    by_label = {
        "kvserve_cache_requests": (
            "kind",
            "Requests by how their prompt was found (cold/partial/exact/session) and where.",
            stats.hits,
        ),
        "kvserve_cache_request_sources": (
            "source",
            "Requests by where their reused tokens came from (none/slot/ram/disk/shared).",
            stats.hit_sources,
        ),
    }
    for name, (label, doc, counts) in by_label.items():
        metric = family(CounterMetricFamily, name, doc, (label,))
        for label_value, count in counts:
            metric.add_metric([model, label_value], count)  # type: ignore[attr-defined]
        yield metric
    cache = stats.cache
    if cache is None:
        return
    tiers = cache.tiers.items()  # the configured ones, in lookup order
    per_tier = {
        "kvserve_cache_entries": (GaugeMetricFamily, "Entries stored.", "entries"),
        "kvserve_cache_bytes": (GaugeMetricFamily, "Bytes stored.", "bytes"),
        "kvserve_cache_evictions": (CounterMetricFamily, "Entries evicted.", "evictions"),
        "kvserve_cache_tier_errors": (
            CounterMetricFamily,
            "Tier I/O that failed (a miss or a lost save, never a failed request).",
            "errors",
        ),
        "kvserve_cache_tier_read_bytes": (CounterMetricFamily, "Bytes loaded.", "bytes_read"),
        "kvserve_cache_tier_written_bytes": (
            CounterMetricFamily,
            "Bytes stored.",
            "bytes_written",
        ),
        "kvserve_cache_tier_io_operations": (
            CounterMetricFamily,
            "Timed reads and writes.",
            "io_ops",
        ),
        "kvserve_cache_tier_io_seconds": (
            CounterMetricFamily,
            "Time in reads and writes (divided by the operations: the mean latency).",
            "io_seconds",
        ),
    }
    for name, (metric_type, doc, field_name) in per_tier.items():
        metric = family(metric_type, name, doc, ("tier",))
        for tier, tier_stats in tiers:
            metric.add_metric([model, tier], getattr(tier_stats, field_name))  # type: ignore[attr-defined]
        yield metric
    lookups = family(
        CounterMetricFamily,
        "kvserve_cache_lookups",
        "Lookups by tier and result.",
        ("tier", "result"),
    )
    for tier, tier_stats in tiers:
        lookups.add_metric([model, tier, "hit"], tier_stats.hits)  # type: ignore[attr-defined]
        lookups.add_metric([model, tier, "miss"], tier_stats.misses)  # type: ignore[attr-defined]
    yield lookups
    totals = {
        "kvserve_cache_saves": ("States stored.", cache.saves),
        "kvserve_cache_saves_dropped": (
            "Saves dropped (writer busy, no room).",
            cache.saves_dropped,
        ),
        "kvserve_cache_save_errors": ("Disk writes that failed.", cache.save_errors),
        "kvserve_cache_saves_skipped": ("Saves covered by an entry.", cache.saves_skipped),
        "kvserve_cache_corrupt_removed": (
            "Corrupt or foreign files removed.",
            cache.corrupt_removed,
        ),
    }
    for name, (doc, value) in totals.items():
        metric = family(CounterMetricFamily, name, doc)
        metric.add_metric([model], value)  # type: ignore[attr-defined]
        yield metric


def make_registry(models: ModelRegistry) -> tuple[CollectorRegistry, ServerMetrics]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(models))
    return registry, ServerMetrics(registry)
