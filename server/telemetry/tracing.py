"""OpenTelemetry traces: the `[tracing]` settings and the helpers any server code may call.

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
import importlib.util
import re
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

TRACES_PATH = "/v1/traces"  # OTLP/HTTP's path for traces, added to a bare collector URL
_PACKAGES = ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP token (RFC 9110)


@dataclass(frozen=True)
class TracingSection:
    """`[tracing]`: where the spans go and how many requests are traced. Checked here,
    where it is made, so every way of setting it (file, environment) is checked once."""

    otlp_endpoint: str = ""  # OTLP/HTTP collector, e.g. http://127.0.0.1:4318; empty: off
    service_name: str = "kvserve"
    sample_ratio: float = 1.0  # of the requests that arrive without a sampled traceparent
    headers: tuple[str, ...] = ()  # "name=value" sent with each export (auth tokens)

    def __post_init__(self) -> None:
        if self.otlp_endpoint:
            url = urlsplit(self.otlp_endpoint)
            if url.scheme not in ("http", "https") or not url.hostname:
                raise ValueError(
                    "otlp_endpoint: an http:// or https:// URL of an OTLP/HTTP "
                    f"collector (e.g. http://127.0.0.1:4318), got {self.otlp_endpoint!r}"
                )
        if not self.service_name.strip():
            raise ValueError("service_name: must not be empty")
        if not 0.0 <= self.sample_ratio <= 1.0:
            raise ValueError(f"sample_ratio: between 0 and 1, got {self.sample_ratio}")
        for entry in self.headers:
            name, sep, value = entry.partition("=")
            if not sep or not _HEADER_NAME.match(name.strip()):
                raise ValueError(f"headers: {entry!r} is not name=value")
            if any(c in value for c in "\r\n\0"):
                raise ValueError(f"headers: the value of {name!r} has a line break")
        if self.enabled and not all(map(importlib.util.find_spec, _PACKAGES)):
            raise ValueError(
                "otlp_endpoint: tracing needs the OpenTelemetry packages: "
                "pip install 'kvserve[tracing]'"
            )

    @property
    def enabled(self) -> bool:
        return bool(self.otlp_endpoint)

    @property
    def traces_url(self) -> str:
        """Where spans are posted: the endpoint as given, or with /v1/traces added when it
        has no path (a collector's base URL, as OTEL_EXPORTER_OTLP_ENDPOINT is)."""
        url = self.otlp_endpoint.rstrip("/")
        return url if urlsplit(url).path else url + TRACES_PATH

    def header_map(self) -> dict[str, str]:
        return {k.strip(): v.strip() for k, v in (e.partition("=")[::2] for e in self.headers)}


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
    "TracingSection",
    "failed",
    "open_span",
    "outgoing_headers",
    "shutdown",
    "span",
    "start",
    "started",
]
