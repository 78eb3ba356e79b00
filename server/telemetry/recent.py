"""Recent traffic for the status page: requests, generated tokens and TTFT in 5-second
buckets over the last five minutes, per model and API key.

/metrics keeps totals since the start (Prometheus computes rates from them); a page has
no Prometheus behind it, so the server keeps this short history itself. It is fed by
`server.telemetry.access` as outputs reach the HTTP layer (on the event loop: no lock), and is
kept per tenant so that a plain key's view shows only its own requests, as /v1/cache
does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

BUCKET_S = 5
KEEP = 60  # buckets: five minutes


@dataclass(slots=True)
class _Counts:
    requests: int = 0  # generation requests that finished in the bucket
    tokens: int = 0  # generated tokens that reached the HTTP layer in the bucket
    ttft_sum: float = 0.0
    ttft_n: int = 0
    ttft_max: float = 0.0


class RecentTraffic:
    def __init__(self, clock: Callable[[], float] = time.time):
        self._clock = clock
        # bucket number (wall time // BUCKET_S) -> (model, tenant) -> counts
        self._buckets: dict[int, dict[tuple[str, str], _Counts]] = {}

    def _counts(self, model: str, tenant: str) -> _Counts:
        now = int(self._clock() // BUCKET_S)
        bucket = self._buckets.get(now)
        if bucket is None:
            bucket = self._buckets[now] = {}
            for old in [b for b in self._buckets if b <= now - KEEP]:
                del self._buckets[old]
        counts = bucket.get((model, tenant))
        if counts is None:
            counts = bucket[(model, tenant)] = _Counts()
        return counts

    def tokens(self, model: str, tenant: str, n: int) -> None:
        self._counts(model, tenant).tokens += n

    def first_token(self, model: str, tenant: str, ttft: float) -> None:
        counts = self._counts(model, tenant)
        counts.ttft_sum += ttft
        counts.ttft_n += 1
        counts.ttft_max = max(counts.ttft_max, ttft)

    def finished(self, model: str, tenant: str) -> None:
        self._counts(model, tenant).requests += 1

    def samples(self, model: str, tenant: str | None) -> list[dict[str, Any]]:
        """The last KEEP buckets of `model`, oldest first, empty ones included (a chart
        needs the gaps); `tenant` None: every key's traffic. The current bucket's rate
        is over the seconds it has run so far."""
        now = self._clock()
        current = int(now // BUCKET_S)
        out = []
        for number in range(current - KEEP + 1, current + 1):
            total = _Counts()
            for (m, t), c in self._buckets.get(number, {}).items():
                if m != model or (tenant is not None and t != tenant):
                    continue
                total.requests += c.requests
                total.tokens += c.tokens
                total.ttft_sum += c.ttft_sum
                total.ttft_n += c.ttft_n
                total.ttft_max = max(total.ttft_max, c.ttft_max)
            start = number * BUCKET_S
            seconds = BUCKET_S if number < current else max(now - start, 1.0)
            out.append(
                {
                    "t": start,
                    "requests": total.requests,
                    "generated_tokens": total.tokens,
                    "tokens_per_s": round(total.tokens / seconds, 2),
                    "ttft_s": round(total.ttft_sum / total.ttft_n, 4) if total.ttft_n else None,
                    "ttft_max_s": round(total.ttft_max, 4) if total.ttft_n else None,
                }
            )
        return out
