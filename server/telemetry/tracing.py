"""OpenTelemetry traces: the helpers any server code may call (their `[tracing]` settings:
server/config/tracing.py).

Off unless `[tracing] otlp_endpoint` is set, and then free: nothing here imports
OpenTelemetry before `start()` runs (the packages are the optional `kvserve[tracing]`
extra), `span()` hands back one shared no-op context manager and `outgoing_headers()` an
empty dict, and the HTTP middleware (server/telemetry/spans.py) is not even installed.

On, each HTTP request is one trace (docs/operations.md "Tracing"): the server span, child of an
incoming W3C `traceparent`, is the current span while the request runs, so
`span("mcp.call", ...)` anywhere below it (event loop or `asyncio.to_thread`) makes a child
span, and `outgoing_headers()` gives the `traceparent` to send on an outgoing call.

One tracer provider per process (OpenTelemetry's own rule): `start()` at the app's start,
`shutdown()` at its end, which sends what is still buffered.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

from server.config.tracing import TracingSection


class _Active:
    """The running provider and its tracer (OpenTelemetry objects, imported lazily)."""

    def __init__(self, section: TracingSection) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        # ParentBased: a request whose caller sampled it (traceparent flag 01) is traced
        # whatever the ratio, one that the caller did not sample is not; the ratio decides
        # for the rest. The provider is ours, not OpenTelemetry's global one.
        self.provider = TracerProvider(
            resource=Resource.create({SERVICE_NAME: section.service_name}),
            sampler=ParentBased(TraceIdRatioBased(section.sample_ratio)),
        )
        exporter = OTLPSpanExporter(endpoint=section.traces_url, headers=section.header_map())
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("kvserve")
        self.propagator = TraceContextTextMapPropagator()


_active: _Active | None = None
_OFF: AbstractContextManager[None] = contextlib.nullcontext()


def start(section: TracingSection) -> None:
    """Start exporting (nothing when tracing is off)."""
    global _active
    if section.enabled and _active is None:
        _active = _Active(section)


def shutdown() -> None:
    """Send the spans still buffered and stop the exporter's thread."""
    global _active
    active, _active = _active, None
    if active is not None:
        active.provider.shutdown()


def active() -> Any:
    """The running tracer state, or None when tracing is off (for spans.py)."""
    return _active


def span(name: str, /, parent: Any = None, **attributes: Any) -> AbstractContextManager[Any]:
    """A child span of the current one (or of `parent`, a span from `open_span`) for the
    `with` block, e.g. `with span("mcp.call", **{"mcp.server": name}):`; a shared no-op
    (yielding None) when tracing is off. An exception leaving the block is recorded on the
    span and marks it failed."""
    if _active is None:
        return _OFF
    context = None
    if parent is not None:
        from opentelemetry import trace

        context = trace.set_span_in_context(parent)
    return _active.tracer.start_as_current_span(name, context=context, attributes=attributes)


def open_span(name: str, /, **attributes: Any) -> Any:
    """A child span of the current one that is not made current, for code that yields
    between its start and its end (an async generator: a span it made current would leak
    into its consumer between yields); the caller ends it (`.end()`) and may hand it to
    `span(parent=...)`. None when tracing is off."""
    if _active is None:
        return None
    return _active.tracer.start_span(name, attributes=attributes)


def failed(span: Any, reason: str) -> None:
    """Mark a span (from `span` or `open_span`; None is ignored) as failed, with why."""
    if span is not None:
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, reason))


def outgoing_headers() -> dict[str, str]:
    """The W3C `traceparent` (and `tracestate`) of the current span, to send with an
    outgoing HTTP call so the callee's spans join this trace; {} when tracing is off."""
    if _active is None:
        return {}
    carrier: dict[str, str] = {}
    _active.propagator.inject(carrier)
    return carrier


@contextlib.contextmanager
def started(section: TracingSection) -> Iterator[None]:
    """start() ... shutdown() around a block (the app's lifespan, tests)."""
    start(section)
    try:
        yield
    finally:
        shutdown()


__all__ = [
    "failed",
    "open_span",
    "outgoing_headers",
    "shutdown",
    "span",
    "start",
    "started",
]
