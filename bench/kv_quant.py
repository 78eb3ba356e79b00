"""A quantized KV cache against f16: what a saved state weighs, and what the output loses.

    python bench/kv_quant.py [--prompts 16] [--prompt-words 120] [--max-tokens 64]

Starts kvserve twice on the bundled model (bench/compare.py's `start`): with the default
f16 KV cache (flash attention on), then with `type_k = type_v = "q8_0"` (which needs
flash attention). Each answers the same prompts (bench/loadgen.py's, a fixed nonce) one
after another, greedy; the script then prints, per variant, the bytes per token of the
states its cache holds (`GET /v1/cache`: RAM tier bytes over entries), and how far the
q8_0 replies agree with the f16 ones: replies equal in full, and the mean length of the
common start in words. Run by hand on a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.compare import start  # noqa: E402
from bench.loadgen import prompt_for  # noqa: E402

VARIANTS = ("kvserve-fa", "kvserve-q8")


def replies(url: str, model: str, prompts: list[str], max_tokens: int) -> list[str]:
    out = []
    with httpx.Client(base_url=url, timeout=600) as client:
        for prompt in prompts:
            body = {"model": model, "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": max_tokens, "temperature": 0}  # fmt: skip
            r = client.post("/chat/completions", json=body)
            r.raise_for_status()
            out.append(r.json()["choices"][0]["message"]["content"])
    return out


def state_bytes(url: str) -> float:
    """The mean size of the states the RAM tier holds (the same prompts each run)."""
    ram = httpx.get(f"{url}/cache", timeout=30).json()["data"][0].get("ram") or {}
    return ram.get("bytes", 0) / ram["entries"] if ram.get("entries") else float("nan")


def common_words(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a.split(), b.split(), strict=False):
        if x != y:
            break
        n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prompt-words", type=int, default=120)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    prompts = [prompt_for(i, args.prompt_words, "kvq") for i in range(args.prompts)]
    got: dict[str, list[str]] = {}
    for name in VARIANTS:
        proc, url, model = start(name, threads=2, parallel=4)
        try:
            got[name] = replies(url, model, prompts, args.max_tokens)
            print(f"{name}: {state_bytes(url) / 2**20:.2f} MiB a saved state", flush=True)
        finally:
            proc.terminate()
            proc.wait(30)
    base, quant = got[VARIANTS[0]], got[VARIANTS[1]]
    equal = sum(a == b for a, b in zip(base, quant, strict=True))
    shared = [common_words(a, b) / max(1, len(a.split())) for a, b in zip(base, quant, strict=True)]
    print(f"q8_0 vs f16, {len(prompts)} greedy replies of up to {args.max_tokens} tokens: "
          f"{equal} equal in full; common start {statistics.mean(shared):.0%} of the f16 "
          f"reply's words on average (min {min(shared):.0%})")  # fmt: skip


if __name__ == "__main__":
    main()
