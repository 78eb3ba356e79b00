"""Multi-turn chat: 8 conversations at once, 10 turns each, the history resent every turn.

    python bench/conversations.py [--servers kvserve-sessions,kvserve,llama_cpp.server]

kvserve-sessions sends each conversation's X-Kvserve-Session, so its slot stays pinned between
turns; kvserve sends none (the slots and the prefix cache still find the history);
kvserve-exact-sessions turns exact_reuse on (the previous reply is prefilled again);
llama_cpp.server is llama-cpp-python's server (pip install -e '.[bench]'). Each server is
started alone on a free port with 8 slots (the peer has one context) and 2 threads.
Prints, per server, the median TTFT of turn 2 and of turn 10, and the total wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.compare import start  # noqa: E402

SYSTEM = "You are a patient tutor. Answer in two sentences, plainly, without lists."
TOPICS = ["volcanoes", "tides", "bread", "bridges", "bees", "glaciers", "comets", "rivers"]


async def turn(
    client: httpx.AsyncClient, model: str, messages: list[dict], session: str | None
) -> tuple[float, str]:
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": 32,
        "temperature": 0,
        "stream": True,
    }
    headers = {"X-Kvserve-Session": session} if session else {}
    started = time.perf_counter()
    first, text = None, ""
    async with client.stream("POST", "/chat/completions", json=body, headers=headers) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
            if first is None and delta:
                first = time.perf_counter() - started
            text += delta
    return (first if first is not None else time.perf_counter() - started), text


async def conversation(
    client: httpx.AsyncClient, model: str, index: int, turns: int, sessions: bool
) -> list[float]:
    messages = [{"role": "system", "content": SYSTEM}]
    ttfts = []
    for t in range(turns):
        messages.append(
            {"role": "user", "content": f"Tell me one more fact about {TOPICS[index]} ({t + 1})."}
        )
        session = f"conv-{index}" if sessions else None
        seconds, reply = await turn(client, model, messages, session)
        ttfts.append(seconds)
        messages.append({"role": "assistant", "content": reply})
    return ttfts


async def drive(base_url: str, model: str, turns: int, sessions: bool) -> tuple[list, float]:
    # A fresh connection per request, for every server alike: llama-server closes idle
    # keep-alive connections, which would surface as "Server disconnected" errors here.
    limits = httpx.Limits(max_connections=16, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base_url, timeout=900, limits=limits) as client:
        started = time.perf_counter()
        per_conv = await asyncio.gather(
            *(conversation(client, model, i, turns, sessions) for i in range(len(TOPICS)))
        )
        return per_conv, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--servers", default="kvserve-sessions,kvserve,llama_cpp.server")
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    rows = []
    for name in args.servers.split(","):
        server = name.removesuffix("-sessions")  # a variant of bench/compare.py's start
        proc, base_url, model = start(server, args.threads, 8)
        try:
            per_conv, wall = asyncio.run(drive(base_url, model, args.turns, "-sessions" in name))
        finally:
            proc.terminate()
            proc.wait(60)
        second = statistics.median(c[1] for c in per_conv)
        last = statistics.median(c[-1] for c in per_conv)
        rows.append((name, second, last, wall))
        print(f"{name}: turn 2 {second:.2f} s, turn {args.turns} {last:.2f} s, total {wall:.1f} s")
    print(f"\n| server | TTFT turn 2 (s) | TTFT turn {args.turns} (s) | ratio | total (s) |")
    print("|---|---|---|---|---|")
    for name, second, last, wall in rows:
        print(f"| {name} | {second:.2f} | {last:.2f} | {last / second:.2f} | {wall:.1f} |")


if __name__ == "__main__":
    main()
