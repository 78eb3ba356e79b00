"""The cost of a generated token, paired: servers compared reply by reply, not run by run.

    python bench/decode_pairs.py --servers kvserve@/tmp/base,kvserve,llama-server --pairs 20

Every server is started first (bench/compare.py's `start`: the bundled model, 8 slots,
2 threads); only the one answering runs, the others are stopped (SIGSTOP). Each pair
round sends one streamed greedy reply of --tokens tokens (`ignore_eos`) to every server
in turn, the order rotating, and times the reply from its first token to its last: the
decode phase alone, without the prompt. Each server's figure is divided by llama-server's
(where named, else the last server's) in the same round.

Why: this machine's speed drifts by 5-15% over minutes, more than the difference between
two servers, so a run of one server against a run of another measures the drift. Replies
a second apart see the same machine; the medians of their ratios repeat within about
0.5%, where bench/compare.py's runs differ by 3-5%.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.compare import print_peer, start  # noqa: E402
from bench.paired import all_started, in_turn, reference_of, resumed  # noqa: E402


def decode_ms_per_token(client: httpx.Client, base_url: str, model: str, n: int, i: int) -> float:
    """One streamed reply of `n` tokens; ms per token after the first."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Write a long story about a cat named {i}."}],
        "max_tokens": n,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    arrivals = []
    with client.stream("POST", f"{base_url}/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choices = json.loads(line[6:]).get("choices")
                if choices and choices[0]["delta"].get("content"):
                    arrivals.append(time.monotonic())
    if len(arrivals) < 2:
        raise RuntimeError(f"{base_url}: {len(arrivals)} content chunks")
    return (arrivals[-1] - arrivals[0]) * 1000 / (len(arrivals) - 1)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--servers", default="kvserve,llama-server")
    p.add_argument("--pairs", type=int, default=20)
    p.add_argument("--tokens", type=int, default=128)
    args = p.parse_args()
    names = [s for s in args.servers.split(",") if s]
    figures: dict[str, list[float]] = {name: [] for name in names}
    # A connection a reply: a server stopped past its keep-alive time closes the idle
    # one as it resumes, under the next request.
    no_reuse = httpx.Limits(max_keepalive_connections=0)
    with httpx.Client(timeout=120, limits=no_reuse) as client:

        def warm(base_url: str, model: str) -> float:
            return decode_ms_per_token(client, base_url, model, 8, -1)

        with all_started(names, lambda name: start(name, 2, 8), warm) as servers:
            for i in range(args.pairs):
                for name, proc, base_url, model in in_turn(servers, i):
                    with resumed(proc):
                        ms = decode_ms_per_token(client, base_url, model, args.tokens, i)
                    figures[name].append(ms)
                    print(f"{i} {name} {ms:.3f} ms/token", file=sys.stderr)
    reference = reference_of(names)
    print(f"| server | ms/token, median | ms/token, mean | over {reference}, median of pairs |")
    print("|---|---|---|---|")
    for name in names:
        ratios = [a / b for a, b in zip(figures[name], figures[reference], strict=True)]
        print(
            f"| {name} | {statistics.median(figures[name]):.3f} | "
            f"{statistics.mean(figures[name]):.3f} | {statistics.median(ratios):.4f} |"
        )
    print_peer(names)


if __name__ == "__main__":
    main()
