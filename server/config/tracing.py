"""`[tracing]`: where the spans go and how many requests are traced (the spans
themselves: server/telemetry/tracing.py)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from urllib.parse import urlsplit

from server.config.values import HEADER_NAME

TRACES_PATH = "/v1/traces"  # OTLP/HTTP's path for traces, added to a bare collector URL
# The optional `kvserve[tracing]` extra: checked at start, imported only when tracing is on.
_PACKAGES = ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")


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
            if not sep or not HEADER_NAME.match(name.strip()):
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
