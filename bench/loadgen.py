"""Load generator for any OpenAI-compatible server (streaming chat completions).

    python bench/loadgen.py --base-url http://127.0.0.1:8080/v1 --concurrency 8 --requests 16

Reports output tokens/s (all requests together), time to first token and inter-token
latency percentiles, and errors. Output tokens are counted from the final usage chunk
when the server sends one (stream_options.include_usage), else one per content chunk.
Run by hand; results go in the README.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx

TOPICS = [
    "the history of the printing press",
    "how volcanoes form",
    "the life cycle of a star",
    "why bread rises",
    "the rules of chess",
    "how a bicycle stays upright",
    "the water cycle",
    "how vaccines work",
    "the invention of the telephone",
    "how bees make honey",
    "the causes of the seasons",
    "how a rainbow forms",
    "the first moon landing",
    "how computers store numbers",
    "the migration of birds",
    "how tides work",
]


def prompt_for(i: int, prompt_words: int, nonce: str) -> str:
    """Prompts share a head (the chat template's system prompt and the first words) and
    differ after it. `nonce` keeps the prompts of one run unlike any earlier run's, so a
    server's prompt cache cannot turn a throughput run into a cache-hit run."""
    topic = TOPICS[i % len(TOPICS)]
    filler = (
        "Please be thorough, use plain words, give concrete examples, and explain each step "
        "so that a curious student could follow along without any prior knowledge. "
    )
    words = f"Write a detailed explanation of {topic} (ref {nonce}-{i}). {filler * 4}".split()
    return " ".join(words[:prompt_words])


@dataclass
class Result:
    ok: bool
    ttft: float = 0.0
    latency: float = 0.0
    tokens: int = 0
    gaps: list[float] = field(default_factory=list)
    error: str = ""


async def sse_objects(response: httpx.Response) -> AsyncIterator[dict]:
    """The JSON objects of a streamed completion's `data:` lines, in order, [DONE] left out."""
    async for line in response.aiter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


def content_of(data: dict) -> str | None:
    """A chat chunk's content delta, if it has one."""
    choices = data.get("choices") or []
    return (choices[0].get("delta") or {}).get("content") if choices else None


async def one_request(
    client: httpx.AsyncClient,
    model: str,
    prompt: str,
    max_tokens: int,
    extra: dict,
) -> Result:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }
    start = time.perf_counter()
    first = last = None
    chunks = 0
    usage_tokens = None
    gaps: list[float] = []
    try:
        async with client.stream("POST", "/chat/completions", json=body) as r:
            if r.status_code != 200:
                return Result(False, error=f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
            async for data in sse_objects(r):
                if "error" in data:
                    return Result(False, error=str(data["error"])[:200])
                if data.get("usage"):
                    usage_tokens = data["usage"].get("completion_tokens")
                if content_of(data):
                    now = time.perf_counter()
                    if first is None:
                        first = now
                    else:
                        gaps.append(now - last)  # type: ignore[operator]
                    last = now
                    chunks += 1
    except httpx.HTTPError as exc:
        return Result(False, error=f"{type(exc).__name__}: {exc}")
    end = time.perf_counter()
    if first is None:
        return Result(False, error="no content received")
    tokens = usage_tokens if usage_tokens is not None else chunks
    return Result(True, ttft=first - start, latency=end - start, tokens=tokens, gaps=gaps)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = min(len(values) - 1, max(0, round(q * (len(values) - 1))))
    return values[k]


async def run_load(
    base_url: str,
    model: str,
    concurrency: int,
    requests: int,
    prompt_words: int,
    max_tokens: int,
    extra: dict,
    api_key: str | None = None,
) -> dict:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    # A fresh connection per request: some servers close idle keep-alive connections,
    # which would show up as client errors that are not the server's fault.
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=0)
    nonce = uuid.uuid4().hex[:8]
    async with httpx.AsyncClient(
        base_url=base_url, timeout=600, limits=limits, headers=headers
    ) as client:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(requests):
            queue.put_nowait(i)
        results: list[Result] = []

        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                prompt = prompt_for(i, prompt_words, nonce)
                results.append(await one_request(client, model, prompt, max_tokens, extra))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    good = [r for r in results if r.ok]
    gaps = [g for r in good for g in r.gaps]
    tokens = sum(r.tokens for r in good)
    return {
        "concurrency": concurrency,
        "requests": requests,
        "errors": len(results) - len(good),
        "error_sample": next((r.error for r in results if not r.ok), ""),
        "output_tokens": tokens,
        "wall_s": round(wall, 2),
        "output_tok_s": round(tokens / wall, 1) if wall > 0 else 0.0,
        "ttft_p50_s": round(percentile([r.ttft for r in good], 0.5), 3),
        "ttft_p95_s": round(percentile([r.ttft for r in good], 0.95), 3),
        "itl_p50_ms": round(1000 * percentile(gaps, 0.5), 1),
        "itl_p95_ms": round(1000 * percentile(gaps, 0.95), 1),
        "latency_mean_s": round(statistics.fmean([r.latency for r in good]), 2) if good else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    p.add_argument("--model", default="SmolLM2-135M-Instruct")
    p.add_argument("--api-key")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument(
        "--prompt-words", type=int, default=20, help="about 60 prompt tokens with the chat template"
    )
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--extra", default="{}", help="JSON merged into every request body")
    args = p.parse_args()
    report = asyncio.run(
        run_load(
            args.base_url,
            args.model,
            args.concurrency,
            args.requests,
            args.prompt_words,
            args.max_tokens,
            json.loads(args.extra),
            args.api_key,
        )
    )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
