"""Speculative decoding (prompt lookup) on and off, on one kvserve, same load.

    python bench/speculative.py --rounds 3

Two loads, each at concurrency 1 and 8, every request sent once with
`"speculative": false` and once with `true` (alternating rounds, so drift hits both):
- grounded: outputs that copy long spans of the prompt (repeat a document, rewrite it
  with small edits, extract its fields as JSON) - what drafting from the prompt is for;
- free: bench/loadgen.py's free-text load (explanations of a topic), where drafts are
  rarely found and the question is what speculation costs.
Greedy outputs of the two modes are compared: they must be identical. Prints a
markdown table of output tokens/s (medians over rounds) and the speed-up.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.compare import start  # noqa: E402
from bench.loadgen import run_load  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
DOCUMENTS = [
    "Invoice 2291 from Harbor Supplies Ltd, dated 14 March 2024, billed to Ms. Clara Jensen, "
    "18 Willow Lane, Dover. Items: twelve oak shelves at 40 pounds each, three brass lamps at "
    "25 pounds each. Payment is due within thirty days by bank transfer to account 4471-22.",
    "def total(items):\n    result = 0\n    for item in items:\n        if item.price > 0:\n"
    "            result += item.price * item.quantity\n    return result\n\n"
    "def average(items):\n    if not items:\n        return 0\n"
    "    return total(items) / len(items)\n",
    "Meeting notes, 2 May: the team agreed to move the launch to June 12. Priya will update the "
    "pricing page, Tom will brief the support staff, and Ana will send the press release to "
    "the three trade magazines by May 20. The budget stays at 18,000 dollars.",
    "Dear residents, the water supply on Elm Street will be interrupted on Tuesday from 9 am "
    "to 3 pm while the old pipes are replaced. Please store enough water for the day. We "
    "apologise for the inconvenience and thank you for your patience.",
]
INSTRUCTIONS = [
    "Repeat the following text exactly, word for word:",
    "Rewrite the following text, changing only the numbers to words:",
    "Copy the following text, fixing any mistakes you find:",
    "Extract every name, date and amount from this text as a JSON object:",
]


def grounded_prompt(i: int) -> str:
    return f"{INSTRUCTIONS[i % len(INSTRUCTIONS)]}\n\n{DOCUMENTS[(i // 4) % len(DOCUMENTS)]}"


async def grounded(base: str, concurrency: int, requests: int, spec: bool) -> tuple[float, list]:
    """Output tokens/s over `requests` grounded prompts, and the texts (for comparison)."""
    texts: list[str] = [""] * requests
    tokens = 0
    queue = list(range(requests))

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal tokens
        while queue:
            i = queue.pop(0)
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": grounded_prompt(i)}],
                "max_tokens": 128,
                "temperature": 0,
                "speculative": spec,
            }
            r = await client.post("/v1/chat/completions", json=body)
            r.raise_for_status()
            data = r.json()
            texts[i] = data["choices"][0]["message"]["content"]
            tokens += data["usage"]["completion_tokens"]

    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base, timeout=600, limits=limits) as client:
        started = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        wall = time.perf_counter() - started
    return tokens / wall, texts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--requests", type=int, default=16)
    # Exact reuse by default here: the modes run the same prompts one after the other, and
    # only with exact reuse is a warm run's greedy output the cold run's, so that the two
    # modes can be compared token for token (bench/compare.py's variants).
    p.add_argument("--server", default="kvserve-exact", help="kvserve or kvserve-exact")
    args = p.parse_args()
    proc, base_v1, _ = start(args.server, args.threads, 8)
    base = base_v1.removesuffix("/v1")
    results: dict[tuple[str, int, bool], list[float]] = {}
    mismatches = 0
    try:
        for _ in range(args.rounds):
            for concurrency in (1, 8):
                texts = {}
                for spec in (False, True):
                    rate, texts[spec] = asyncio.run(
                        grounded(base, concurrency, args.requests, spec)
                    )
                    results.setdefault(("grounded", concurrency, spec), []).append(rate)
                mismatches += sum(a != b for a, b in zip(texts[False], texts[True], strict=True))
                for spec in (False, True):
                    report = asyncio.run(
                        run_load(
                            f"{base}/v1",
                            MODEL,
                            concurrency,
                            args.requests,
                            20,
                            64,
                            {"speculative": spec},
                        )
                    )
                    results.setdefault(("free", concurrency, spec), []).append(
                        report["output_tok_s"]
                    )
        drafted, accepted = spec_counters(base)
    finally:
        proc.terminate()
        proc.wait(30)
    print("| load | conc. | plain tok/s | speculative tok/s | speed-up |")
    print("|---|---|---|---|---|")
    for load in ("grounded", "free"):
        for concurrency in (1, 8):
            plain = statistics.median(results[(load, concurrency, False)])
            spec = statistics.median(results[(load, concurrency, True)])
            print(f"| {load} | {concurrency} | {plain:.1f} | {spec:.1f} | {spec / plain:.2f}x |")
    print(f"\ngreedy outputs that differ between the modes: {mismatches}")
    rate = accepted / max(drafted, 1)
    print(f"draft tokens: {drafted:.0f}, accepted: {accepted:.0f} ({rate:.0%})")


def spec_counters(base: str) -> tuple[float, float]:
    """kvserve_spec_drafted_tokens_total and ..._accepted_... from /metrics."""
    values = {"drafted": 0.0, "accepted": 0.0}
    for line in httpx.get(f"{base}/metrics", timeout=10).text.splitlines():
        name, _, value = line.partition(" ")
        for kind in values:
            if name.startswith(f"kvserve_spec_{kind}_tokens_total"):
                values[kind] += float(value)
    return values["drafted"], values["accepted"]


if __name__ == "__main__":
    main()
