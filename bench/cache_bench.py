"""Micro-benchmark of the prefix cache alone (no model): lookup latency and save throughput.

    python bench/cache_bench.py [--entries 1000] [--prompt-tokens 2000] [--state-mb 46]

Lookup: `--entries` stored entries of `--prompt-tokens` tokens (1 KiB states, RAM), then
the latency of lookups of a prompt of that length: a hit on a distinct entry, a miss,
and a hit where every entry shares one long system prompt (the widest fan-out at the
deepest boundary). Save: entries with `--state-mb` states, stored in RAM only and then
written through to disk (temp file, fsync, rename), timed from the first save() to
flush(); plus the time save() itself takes on the caller's thread, and the latency of a
lookup served from disk (read, checksum, promotion). Run by hand; figures go in reports
and the README.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable

from cache import CacheConfig, PrefixCache


def percentiles(samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)

    def at(q: float) -> float:
        return ms[min(len(ms) - 1, int(len(ms) * q))]

    return f"median {statistics.median(ms):.3f} ms, p95 {at(0.95):.3f} ms, p99 {at(0.99):.3f} ms"


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def fill(cache: PrefixCache, prompts: list[list[int]]) -> None:
    for prompt in prompts:
        while not cache.save(prompt, bytes(1024)):
            cache.flush()
    cache.flush()


def bench_lookup(num_entries: int, num_tokens: int, repeat: int) -> None:
    rng = random.Random(0)
    vocab = 49152
    distinct = [[rng.randrange(vocab) for _ in range(num_tokens)] for _ in range(num_entries)]
    cache = PrefixCache(CacheConfig(ram_bytes=1 << 30), "bench")
    fill(cache, distinct)
    hit_prompt = distinct[num_entries // 2][: num_tokens - 100] + [1] * 100
    miss_prompt = [rng.randrange(vocab) for _ in range(num_tokens)]
    print(f"lookup, {num_entries} distinct entries of {num_tokens} tokens (RAM):")
    print(f"  hit : {percentiles(timed(lambda: cache.lookup(hit_prompt), repeat))}")
    print(f"  miss: {percentiles(timed(lambda: cache.lookup(miss_prompt), repeat))}")
    cache.close()

    system = [rng.randrange(vocab) for _ in range(num_tokens - 100)]
    shared = [system + [rng.randrange(vocab) for _ in range(100)] for _ in range(num_entries)]
    cache = PrefixCache(CacheConfig(ram_bytes=1 << 30), "bench")
    fill(cache, shared)
    question = system + [rng.randrange(vocab) for _ in range(100)]
    print(f"lookup, {num_entries} entries sharing a {len(system)}-token system prompt:")
    print(f"  hit : {percentiles(timed(lambda: cache.lookup(question), repeat))}")
    cache.close()


def bench_save(state_mb: float, num_tokens: int, count: int) -> None:
    state = bytes(range(256)) * int(state_mb * 1e6 / 256)
    prompts = [[i] * num_tokens for i in range(count)]
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        for label, disk_dir in (("RAM only", ""), ("RAM + disk", tmp)):
            config = CacheConfig(ram_bytes=2 << 30, disk_dir=disk_dir, writer_queue=count)
            cache = PrefixCache(config, "bench")
            calls: list[float] = []
            start = time.perf_counter()
            for prompt in prompts:
                call = time.perf_counter()
                assert cache.save(prompt, state)
                calls.append(time.perf_counter() - call)
            cache.flush()
            elapsed = time.perf_counter() - start
            rate = f"{count / elapsed:.1f} entries/s, {count * len(state) / 1e6 / elapsed:.0f} MB/s"
            if not disk_dir:
                rate = f"{count / elapsed:.0f} entries/s (RAM keeps the caller's bytes: no copy)"
            print(f"save {count} x {len(state) / 1e6:.0f} MB, {label}: {rate}")
            print(f"  save() on the caller's thread: {percentiles(calls)}")
            cache.close()
        reopened = PrefixCache(CacheConfig(ram_bytes=0, disk_dir=tmp), "bench")
        loads = timed(lambda: reopened.lookup(prompts[0]), 5)
        print(f"lookup served from disk ({len(state) / 1e6:.0f} MB): {percentiles(loads)}")
        reopened.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=1000)
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--state-mb", type=float, default=46)
    parser.add_argument("--saves", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()
    bench_lookup(args.entries, args.prompt_tokens, args.repeat)
    bench_save(args.state_mb, args.prompt_tokens, args.saves)


if __name__ == "__main__":
    main()
