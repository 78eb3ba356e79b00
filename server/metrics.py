"""GET /metrics: Prometheus exposition on a registry owned by the app.

The engine exposes plain numbers (`EngineStats`); this collector turns them into
metrics at scrape time, so nothing is counted twice and the engine never sees
prometheus_client.
"""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

router = APIRouter()


class EngineCollector(Collector):
    def __init__(self, engine: object):
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        stats = self.engine.stats()  # type: ignore[attr-defined]
        if stats is None:
            return
        gauges = {
            "kvserve_slots_total": ("Sequence slots of the engine.", stats.num_slots),
            "kvserve_slots_in_use": ("Slots held by running sequences.", stats.num_running),
            "kvserve_queue_depth": ("Sequences waiting for a slot.", stats.num_waiting),
            "kvserve_kv_cells_used": ("KV cache cells in use.", stats.kv_cells_used),
            "kvserve_batch_tokens": ("Tokens in the last llama_decode.", stats.last_batch_size),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(name, doc, value=value)
        counters = {
            "kvserve_engine_steps": ("llama_decode calls of the step loop.", stats.num_steps),
            "kvserve_prefill_tokens": ("Prompt tokens prefilled.", stats.num_prefill_tokens),
            "kvserve_generated_tokens": ("Tokens sampled.", stats.num_generated_tokens),
            "kvserve_preemptions": ("Sequences preempted for KV space.", stats.num_preemptions),
            "kvserve_decode_failures": ("Failed llama_decode calls.", stats.num_decode_failures),
        }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(name, doc, value=value)


def make_registry(engine: object) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engine))
    return registry


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus metrics of this server."""
    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)
