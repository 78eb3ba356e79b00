"""Requests on their way to an engine: counted so that a burst is admitted together.

Several requests that arrive at once reach the engine one after another: each is parsed,
templated and tokenized on the event loop first, a few milliseconds apiece. An idle
engine woken by the first would start its prefill alone, and the rest would wait for
that step before their own prefill starts (measured at concurrency 8: the first TTFT
0.24 s, the seven others 1.44 s; llama-server, whose HTTP threads queue all eight before
its loop runs, gave all eight 1.18 s). So the HTTP layer takes a `Ticket` per generation
request as it arrives (`Arrivals.expect`) and hands it on in the `ARRIVAL` context
variable; `Engine.generate` closes it once the request is queued (or refused), and an
idle engine woken by a request waits, briefly, while tickets are open (worker.py).

Tickets are taken and closed on the event loop; the engine thread only reads the count.
"""

from __future__ import annotations

from contextvars import ContextVar

# The longest an idle engine waits for the rest of a burst (see Worker._gather_burst).
BURST_WAIT_S = 0.05


class Arrivals:
    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0  # open tickets: requests arrived, not yet queued or refused

    def expect(self) -> Ticket:
        self.count += 1
        return Ticket(self)


class Ticket:
    __slots__ = ("_arrivals",)

    def __init__(self, arrivals: Arrivals):
        self._arrivals: Arrivals | None = arrivals

    def close(self) -> None:
        """The request was queued or refused (idempotent)."""
        if self._arrivals is not None:
            self._arrivals.count -= 1
            self._arrivals = None


# The ticket of the request being handled (set by the HTTP layer, closed by the engine).
ARRIVAL: ContextVar[Ticket | None] = ContextVar("kvserve_arrival", default=None)
