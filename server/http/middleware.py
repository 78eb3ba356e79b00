"""The ASGI middleware in front of every route: the access record (log line, metrics,
shutdown gate); the origin and host guard (browsers of other sites may not drive the
server). The key check before the body is server/http/key_first.py; the bodies' limits
server/http/bodies.py."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.errors import Forbidden, ServiceUnavailable, shaped
from server.telemetry.access import AccessRecord, activate, deactivate, request_id_from

if TYPE_CHECKING:
    from server.http.drain import Lifecycle
    from server.telemetry.metrics import ServerMetrics


# Answered while the server drains for shutdown, so that probes and a last scrape work.
_ALWAYS_OPEN = ("/health", "/livez", "/metrics")


class AccessMiddleware:
    """The outermost layer: request id, access record and log line, request metrics,
    and shutdown's gate (503 for new requests while draining)."""

    def __init__(
        self,
        app: ASGIApp,
        lifecycle: Lifecycle,
        metrics: ServerMetrics | None,
        log_lines: bool,
    ):
        self.app = app
        self.lifecycle = lifecycle
        self.metrics = metrics
        self.log_lines = log_lines

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        request_id = request_id_from(headers.get(b"x-request-id", b"").decode("latin-1"))
        record = AccessRecord(request_id, scope["method"], scope["path"], self.metrics)
        echoed = (b"x-request-id", request_id.encode("latin-1"))

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
                message = {**message, "headers": [*message.get("headers", []), echoed]}
            await send(message)

        left = False  # whether the client disconnected

        async def receive_noting_disconnect() -> Message:
            nonlocal left
            message = await receive()
            left = left or message["type"] == "http.disconnect"
            return message

        token = activate(record)
        self.lifecycle.inflight.add(record)
        try:
            if self.lifecycle.draining and scope["path"] not in _ALWAYS_OPEN:
                refusal = ServiceUnavailable(
                    "the server is shutting down",
                    code="shutting_down",
                    headers={"Retry-After": "1"},
                )
                await shaped(refusal, scope["path"])(scope, receive, send_with_id)
            else:
                await self.app(scope, receive_noting_disconnect, send_with_id)
        finally:
            self.lifecycle.inflight.discard(record)
            deactivate(token)
            route = scope.get("route")
            record.endpoint = getattr(route, "path", "other")
            if record.status == 0:  # nothing was answered: the client left first (nginx's
                # 499, not a server error to alert on), else the app raised
                record.status = 499 if left else 500
            record.finish(log_line=self.log_lines)


STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_DEFAULT_PORTS = {"http": "80", "https": "443"}


def _is_loopback_ip(text: str) -> bool:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def split_host(host: str) -> tuple[str, str]:
    """`Host` header -> (name, port): "[::1]:8080" -> ("::1", "8080"), "a.b" -> ("a.b", "")."""
    host = host.strip().lower()
    if host.startswith("["):
        name, _, rest = host[1:].partition("]")
        return name, rest.removeprefix(":")
    name, sep, port = host.rpartition(":")
    if sep and port.isdigit() and ":" not in name:
        return name, port
    return host, ""


def is_loopback_name(name: str) -> bool:
    """Whether a host name always means this machine (RFC 6761: localhost and its
    subdomains; browsers never ask DNS for them) or is a loopback address."""
    name = name.rstrip(".")
    return name == "localhost" or name.endswith(".localhost") or _is_loopback_ip(name)


def _origin_netloc(origin: str) -> tuple[str, str, str] | None:
    """An origin's (scheme, host, port): "https://a.b" -> ("https", "a.b", "443"); None
    for "null" and anything that is no origin."""
    try:
        url = urlsplit(origin.strip().lower())
        port = str(url.port) if url.port is not None else _DEFAULT_PORTS.get(url.scheme, "")
    except ValueError:
        return None
    if not url.scheme or not url.hostname:
        return None
    return url.scheme, url.hostname, port


def _normal_origin(origin: str) -> str:
    return origin.strip().lower().rstrip("/")


class OriginGuard:
    """Browsers of other sites may not drive the server: the requests below are refused
    (403, in the shape of the API the path belongs to) before their body is read.

    Every route reads its body as JSON whatever the Content-Type (curl's default form type
    included, as llama-server and Ollama do; server/http/bodies.py). That makes any page a
    user opens able to send a "simple" cross-origin POST (text/plain, no preflight) to a
    server on their machine or network. Two checks keep such pages out:

    - **Origin**: a state-changing request (POST, PUT, PATCH, DELETE) that carries an
      `Origin` header (browsers send one on every cross-origin request and on same-origin
      POSTs) is refused with 403 unless that origin is the server's own (the origin's host
      and port are the request's `Host`) or one of `[server] cors_origins` ("*": any).
      Clients that are not browsers send no Origin and are not affected.
    - **Host** (DNS rebinding: a page's own name re-pointed at 127.0.0.1, so that the
      browser counts the server as the page's origin): a request that arrived on a loopback
      address must name in its `Host` header `localhost` (or `*.localhost`), an IP address,
      or one of `[server] allowed_hosts`, else 403. With `allowed_hosts` set, every
      request is held to the same list ("*": no Host check at all); without it, a server
      reached over the network accepts the Host its clients or proxy chose and relies on
      its API keys and the Origin check."""

    def __init__(
        self, app: ASGIApp, cors_origins: Iterable[str], allowed_hosts: Iterable[str]
    ) -> None:
        self.app = app
        self.cors_origins = frozenset(_normal_origin(o) for o in cors_origins)
        hosts = [h.strip().lower() for h in allowed_hosts]
        self.any_host = "*" in hosts
        self.allowed_hosts = frozenset(split_host(h)[0].rstrip(".") for h in hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        host = headers.get(b"host", b"").decode("latin-1")
        refusal = self._host_refusal(scope, host)
        if refusal is None and scope["method"] in STATE_CHANGING and b"origin" in headers:
            refusal = self._origin_refusal(headers[b"origin"].decode("latin-1"), host)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        await shaped(refusal, scope["path"])(scope, receive, send)

    def _host_refusal(self, scope: Scope, host: str) -> Forbidden | None:
        if self.any_host or not host:
            return None
        # The address the connection arrived on (uvicorn: the socket's own address; an
        # in-process ASGI client names the URL's host). A loopback arrival is always
        # checked: there a foreign name can only mean a browser fooled by DNS. Others
        # are checked when the operator listed the names (a container whose port is
        # published on the host's loopback sees its clients on its own network).
        local = scope.get("server") or ("",)
        on_loopback = _is_loopback_ip(str(local[0]))
        if not on_loopback and not self.allowed_hosts:
            return None
        name = split_host(host)[0].rstrip(".")
        if is_loopback_name(name) or _is_ip(name) or name in self.allowed_hosts:
            return None  # an address names itself: DNS, and so rebinding, plays no part
        return Forbidden(
            f"the Host {host!r} is not one this server answers to (a page's name "
            "re-pointed at it?); add it to [server] allowed_hosts to serve it",
            code="host_not_allowed",
        )

    def _origin_refusal(self, origin: str, host: str) -> Forbidden | None:
        if "*" in self.cors_origins or _normal_origin(origin) in self.cors_origins:
            return None
        parsed = _origin_netloc(origin)
        if parsed is not None and host:
            scheme, name, port = parsed
            host_name, host_port = split_host(host)
            if (host_name, host_port or _DEFAULT_PORTS.get(scheme, "")) == (name, port):
                return None  # the server's own page
        return Forbidden(
            f"a browser page of another origin ({origin!r}) may not send this request: "
            "only the server's own origin and [server] cors_origins may",
            code="origin_not_allowed",
        )
