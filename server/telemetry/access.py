"""Per-request records: the access-log line, the request metrics, shutdown's handle.

`AccessMiddleware` opens an `AccessRecord` for every HTTP request and makes it the
current one (a context variable, so tasks the request starts, such as an SSE stream's,
see the same record). Handlers and `server.serving.drive` fill it in: the model
(`deps.resolve_model`), the generations and each output as it reaches the HTTP layer
(TTFT, inter-token latency, token counts, engine stage timings, session, how the prompt
was found in the cache). When the response is done the middleware
writes one log line and counts the request.
"""

from __future__ import annotations

import contextvars
import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from engine.client import FinishReason, SeqOutput
from server.telemetry.logs import escape_controls

if TYPE_CHECKING:
    from engine.client import Generation
    from server.telemetry.metrics import ServerMetrics

access_log = logging.getLogger("kvserve.access")

_current: contextvars.ContextVar[AccessRecord | None] = contextvars.ContextVar(
    "kvserve_access_record", default=None
)


def current_record() -> AccessRecord | None:
    """The record of the request being handled here, if any (None outside a request)."""
    return _current.get()


class SequenceTrace(Protocol):
    """What a request's trace takes from its record (server/telemetry/spans.py's
    RequestTrace; named here so that the record need not import the tracing code)."""

    def sequence_done(self, index: int, out: SeqOutput, model: str | None) -> None: ...


@dataclass(eq=False)
class AccessRecord:
    request_id: str
    method: str
    path: str
    metrics: ServerMetrics | None = None
    start: float = field(default_factory=time.monotonic)
    endpoint: str = "other"
    model: str | None = None  # the served model's id, once the request named a known one
    tenant: str = ""  # the caller's key digest (deps.get_caller): recent traffic per key
    status: int = 0
    session: str | None = None
    cache_hit: str | None = None  # exact / partial / session / cold, from the cache work
    cold_reason: str | None = None  # cold although a stored prefix was found: why
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    ttft: float | None = None
    aborted: bool = False  # a sequence ended without finishing (client gone, shutdown)
    shutting_down: bool = False
    generations: list[Generation] = field(default_factory=list)
    trace: SequenceTrace | None = None  # set when tracing is on and samples this request
    trace_id: str | None = None
    _last_token: dict[tuple[int, int], float] = field(default_factory=dict)
    _itl: Any = None  # the model's inter-token-latency histogram child

    def watch(self, generation: Generation) -> None:
        """Called as a handler starts reading `generation`: shutdown may abort it."""
        self.generations.append(generation)
        if self.shutting_down:
            generation.abort()

    def cancel(self) -> None:
        """Shutdown's grace is over: abort what runs now and whatever starts later."""
        self.shutting_down = True
        for generation in self.generations:
            generation.abort()

    @property
    def unfinished(self) -> bool:
        return any(not g.finished for g in self.generations)

    def observe(self, generation: Generation, index: int, out: SeqOutput) -> None:
        """One engine output reaching the HTTP layer."""
        now = time.monotonic()
        metrics, model = self.metrics, self.model or ""
        if out.token_ids:
            key = (id(generation), index)
            last = self._last_token.get(key)
            if metrics is not None:
                metrics.recent.tokens(model, self.tenant, len(out.token_ids))
            if self.ttft is None:
                self.ttft = now - self.start
                if metrics is not None:
                    metrics.ttft.labels(model).observe(self.ttft)
                    metrics.recent.first_token(model, self.tenant, self.ttft)
            elif last is not None and metrics is not None:
                # Tokens that arrive together share the gap since the previous arrival.
                # The labelled child is looked up once per request, not per token.
                if self._itl is None:
                    self._itl = metrics.itl.labels(model)
                gap = (now - last) / len(out.token_ids)
                for _ in out.token_ids:
                    self._itl.observe(gap)
            self._last_token[key] = now
        if out.finish_reason is None:
            return
        if out.finish_reason is FinishReason.ABORT:
            self.aborted = True
        if index == 0:  # the n choices of one prompt share it: count it once
            self.prompt_tokens += out.num_prompt_tokens
            self.cached_tokens += out.num_cached_tokens
            self.cache_hit = out.hit_kind or self.cache_hit
            if out.hit_kind == "cold" and out.timings is not None:
                self.cold_reason = out.timings.cold_reason or None
            self.session = generation.session_id or self.session
        self.generated_tokens += out.num_output_tokens
        if self.trace is not None:
            self.trace.sequence_done(index, out, self.model)
        timings = out.timings
        if metrics is not None and timings is not None:
            if timings.queue_wait is not None:
                metrics.queue_wait.labels(model).observe(timings.queue_wait)
            if timings.prefill is not None:
                metrics.prefill.labels(model).observe(timings.prefill)

    def fields(self) -> dict[str, Any]:
        """The access-log line's fields (None: not known for this request)."""
        return {
            "request_id": self.request_id,
            "method": self.method,
            "path": self.path,
            "endpoint": self.endpoint,
            "model": self.model,
            "status": self.status,
            "session": self.session,
            "cache_hit": self.cache_hit,
            "cold_reason": self.cold_reason,
            "prompt_tokens": self.prompt_tokens if self.generations else None,
            "cached_tokens": self.cached_tokens if self.generations else None,
            "generated_tokens": self.generated_tokens if self.generations else None,
            "ttft_s": None if self.ttft is None else round(self.ttft, 4),
            "duration_s": round(time.monotonic() - self.start, 4),
            "trace_id": self.trace_id,
        }

    def finish(self, *, log_line: bool) -> None:
        """The response is done: count it, and write its access-log line."""
        fields = self.fields()
        metrics, model = self.metrics, self.model or ""
        if metrics is not None:
            metrics.requests.labels(model, self.endpoint, str(self.status)).inc()
            if self.status == 429:
                metrics.rejected.labels(model).inc()
            if self.generations:
                metrics.recent.finished(model, self.tenant)
                metrics.e2e.labels(model).observe(fields["duration_s"])
                metrics.prompt_tokens.labels(model).inc(self.prompt_tokens)
                metrics.cached_tokens.labels(model).inc(self.cached_tokens)
                metrics.generated_tokens.labels(model).inc(self.generated_tokens)
                if self.aborted or self.unfinished or self.status == 499:
                    metrics.cancelled.labels(model).inc()
        if log_line:
            text = " ".join(f"{k}={_logfmt(v)}" for k, v in fields.items() if v is not None)
            access_log.info("%s", text, extra={"access": fields})


# A value that could be read as more than one field, or that holds control characters.
_QUOTED = re.compile(r'[\s"=\\]|^$')


def _logfmt(value: Any) -> str:
    """A field's value in the text line: as it is, or quoted (logfmt's way) with its
    quotes, backslashes and control characters escaped when it holds a space, a quote,
    '=' or a control character: the path, model and session come from the client, and
    `/x status=200` or a newline must not write a field or a line of its making."""
    text = str(value)
    if not _QUOTED.search(text) and escape_controls(text) == text:
        return text
    return '"' + escape_controls(text.replace("\\", "\\\\").replace('"', '\\"')) + '"'


def request_id_from(header: str | None) -> str:
    """The client's X-Request-Id when it is a sane token, else a fresh one."""
    sane = header and len(header) <= 128 and header.isascii() and header.isprintable()
    if sane and header and " " not in header:
        return header
    return uuid.uuid4().hex


def activate(record: AccessRecord) -> contextvars.Token[AccessRecord | None]:
    return _current.set(record)


def deactivate(token: contextvars.Token[AccessRecord | None]) -> None:
    _current.reset(token)
