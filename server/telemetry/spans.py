"""The spans of one request: the HTTP server span, and the engine's stages under it.

Imported only when tracing is on (server/app.py installs `TracingMiddleware` then), so
OpenTelemetry is imported here at the top. The engine knows nothing of traces: it stamps
each sequence's stages (`engine.types.Timings`, with the final output) and the spans
are made here afterwards with those times, so the engine thread does no tracing work.

    POST /v1/chat/completions          server span: method, route, status
    └── kvserve.generate               one per sequence (choice): tokens, hit, finish
        ├── kvserve.cache.lookup       the prefix-cache lookup: tier, tokens matched
        │   └── redis find|get|touch   each call it made to the shared tier (Redis)
        ├── kvserve.queue              waiting for a slot
        ├── kvserve.cache.restore      the found KV state loaded into the slot
        ├── kvserve.prefill            prompt tokens computed and reused
        └── kvserve.decode             tokens generated, tokens/s
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode, format_trace_id
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.client import FinishReason, SeqOutput, StoreCall, Timings
from server.telemetry import tracing
from server.telemetry.access import current_record

_PROPAGATED = (b"traceparent", b"tracestate")
# Probes and scrapes, a few a second from every load balancer and Prometheus: no traces.
UNTRACED = ("/health", "/livez", "/metrics")


class TracingMiddleware:
    """The server span of each HTTP request (inside AccessMiddleware, which logs its trace
    id): a child of the request's `traceparent`, current while the app handles it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        active = tracing.active()
        if scope["type"] != "http" or active is None or scope["path"] in UNTRACED:
            await self.app(scope, receive, send)
            return
        headers = scope["headers"]
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers if k in _PROPAGATED}
        parent = active.propagator.extract(carrier)
        method = scope["method"]
        span = active.tracer.start_span(
            method, context=parent, kind=SpanKind.SERVER, attributes=_request_attributes(scope)
        )
        record = current_record()
        if record is not None and span.is_recording():
            record.trace = RequestTrace(active.tracer, span)
            record.trace_id = format_trace_id(span.get_span_context().trace_id)
        status = 0

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        token = otel_context.attach(trace.set_span_in_context(span, parent))
        try:
            await self.app(scope, receive, send_status)
        except BaseException as exc:
            span.record_exception(exc)
            status = status or 500
            raise
        finally:
            otel_context.detach(token)
            route = getattr(scope.get("route"), "path", None)
            if route is not None:
                span.update_name(f"{method} {route}")
                span.set_attribute("http.route", route)
            status = status or 500  # the app ended without answering
            span.set_attribute("http.response.status_code", status)
            if status >= 500:  # a server span fails on 5xx only (4xx: the client's)
                span.set_status(Status(StatusCode.ERROR))
            if record is not None and record.model:
                span.set_attribute("kvserve.model", record.model)
            span.end()


def _request_attributes(scope: Scope) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "http.request.method": scope["method"],
        "url.path": scope["path"],
        "url.scheme": scope.get("scheme", "http"),
    }
    server, client = scope.get("server"), scope.get("client")
    if server:
        attributes["server.address"], attributes["server.port"] = server[0], server[1]
    if client:
        attributes["client.address"] = client[0]
    for name, value in scope["headers"]:
        if name == b"user-agent":
            attributes["user_agent.original"] = value.decode("latin-1")[:256]
    return attributes


class RequestTrace:
    """The server span of one request, and the engine spans made under it."""

    def __init__(self, tracer: Any, span: Any) -> None:
        self.tracer = tracer
        self.span = span

    def sequence_done(self, index: int, out: SeqOutput, model: str | None) -> None:
        """One sequence's final output: its stages as spans, at the times they happened."""
        t = out.timings
        if t is None:
            return
        ns = _Clock()
        start = t.lookup[0] if t.lookup is not None else t.arrival
        end = t.finished if t.finished is not None else time.monotonic()
        generated = out.num_output_tokens
        computed = out.num_prompt_tokens - out.num_cached_tokens
        attributes: dict[str, Any] = {
            "kvserve.choice": index,
            "kvserve.hit": out.hit_kind,
            "kvserve.tokens.prompt": out.num_prompt_tokens,
            "kvserve.tokens.reused": out.num_cached_tokens,
            "kvserve.tokens.computed": computed,
            "kvserve.tokens.generated": generated,
            "kvserve.finish_reason": str(out.finish_reason),
        }
        if model:
            attributes["kvserve.model"] = model
        parent = trace.set_span_in_context(self.span)
        root = self.tracer.start_span(
            "kvserve.generate", context=parent, start_time=ns(start), attributes=attributes
        )
        if out.finish_reason is FinishReason.ERROR:
            root.set_status(Status(StatusCode.ERROR, out.error or "failed"))
        inside = trace.set_span_in_context(root)

        def child(name: str, begin: float | None, stop: float | None,
                  attrs: dict[str, Any], under: Any = inside) -> Any:  # fmt: skip
            return self._stage(ns, under, name, begin, stop, attrs)

        tier, tokens, reused = "kvserve.cache.tier", "kvserve.cache.tokens", out.num_cached_tokens
        if t.lookup is not None:
            found = {tier: t.lookup_tier or "none", tokens: t.lookup_tokens}
            lookup = child("kvserve.cache.lookup", t.lookup[0], t.lookup[1], found)
            for call in t.lookup_calls:  # what it asked the shared tier, as Redis spans
                self._stage(ns, trace.set_span_in_context(lookup), f"redis {call.operation}",
                            call.start, call.end, _store_attributes(call), call.error)  # fmt: skip
        child("kvserve.queue", t.arrival, t.admitted, {})
        if t.restore is not None:
            restored = {tier: t.reuse_source, tokens: reused}
            child("kvserve.cache.restore", t.restore[0], t.restore[1], restored)
        prefill_start = t.restore[1] if t.restore is not None else t.admitted
        prefill = {
            "kvserve.tokens.computed": computed,
            "kvserve.tokens.reused": reused,
            "kvserve.reuse_source": t.reuse_source,
        }
        child("kvserve.prefill", prefill_start, t.prompt_done, prefill)
        decode = _decode_attributes(t, generated, end)
        child("kvserve.decode", t.prompt_done, end if generated else None, decode)
        root.end(end_time=ns(end))


    def _stage(self, ns: _Clock, under: Any, name: str, begin: float | None, stop: float | None,
               attrs: dict[str, Any], error: str | None = None) -> Any:  # fmt: skip
        """One ended span from `begin` to `stop` under `under`; None for a stage the
        sequence never reached (aborted, failed)."""
        if begin is None or stop is None:
            return None
        span = self.tracer.start_span(name, context=under, start_time=ns(begin),
                                      attributes=attrs)  # fmt: skip
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=ns(max(begin, stop)))
        return span


def _store_attributes(call: StoreCall) -> dict[str, Any]:
    """OpenTelemetry's database attributes, as the responses store's Redis spans have."""
    attributes: dict[str, Any] = {"db.system.name": "redis", "db.operation.name": call.operation,
                                  "server.address": call.address}  # fmt: skip
    if call.port is not None:
        attributes["server.port"] = call.port
    return attributes


def _decode_attributes(t: Timings, generated: int, end: float) -> dict[str, Any]:
    attributes: dict[str, Any] = {"kvserve.tokens.generated": generated}
    if t.prompt_done is not None and end > t.prompt_done:
        attributes["kvserve.tokens_per_s"] = round(generated / (end - t.prompt_done), 2)
    if t.first_token is not None:
        attributes["kvserve.ttft_s"] = round(t.first_token - t.arrival, 6)
    return attributes


class _Clock:
    """time.monotonic() seconds (the engine's stamps) -> epoch nanoseconds (OTLP's)."""

    def __init__(self) -> None:
        self.offset = time.time_ns() - time.monotonic_ns()

    def __call__(self, monotonic_s: float) -> int:
        return int(monotonic_s * 1e9) + self.offset
