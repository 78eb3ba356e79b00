"""A real OTLP/HTTP trace receiver on loopback: what kvserve's exporter posts, decoded
with `opentelemetry-proto` into plain `Span` records the tests can look at."""

from __future__ import annotations

import contextlib
import gzip
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanProto

KINDS = {SpanProto.SPAN_KIND_SERVER: "server", SpanProto.SPAN_KIND_INTERNAL: "internal"}


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root span
    kind: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status: int  # 0 unset, 1 ok, 2 error
    resource: dict[str, Any]

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


@dataclass
class Receiver:
    url: str = ""
    spans: list[Span] = field(default_factory=list)
    posts: list[dict[str, str]] = field(default_factory=list)  # each export's headers
    lock: threading.Lock = field(default_factory=threading.Lock)

    def wait_for(self, count: int, timeout: float = 20.0) -> list[Span]:
        """The spans, once at least `count` have arrived (AssertionError past `timeout`)."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                if len(self.spans) >= count:
                    return list(self.spans)
            assert time.monotonic() < deadline, f"{len(self.spans)} spans after {timeout}s"
            time.sleep(0.05)

    def named(self, name: str) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.name == name]


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def _attributes(items: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in items}


def _decode(body: bytes) -> list[Span]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    out = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                out.append(
                    Span(
                        name=s.name,
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex(),
                        kind=KINDS.get(s.kind, str(s.kind)),
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                        attributes=_attributes(s.attributes),
                        status=s.status.code,
                        resource=resource,
                    )
                )
    return out


@contextlib.contextmanager
def running_receiver() -> Iterator[Receiver]:
    """An OTLP/HTTP receiver on a free loopback port; `url` is its base URL."""
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            ok = self.path == "/v1/traces" and self.headers.get_content_type() == (
                "application/x-protobuf"
            )
            if ok:
                spans = _decode(body)
                with receiver.lock:
                    receiver.posts.append(dict(self.headers.items()))
                    receiver.spans.extend(spans)
            reply = ExportTraceServiceResponse().SerializeToString() if ok else b""
            self.send_response(200 if ok else 404)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
