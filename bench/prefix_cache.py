"""Time to first token with a long shared system prompt: cold, warm in a slot, warm from
the RAM tier, warm from the disk tier, and after a restart; plus n=4 through fork.

    python bench/prefix_cache.py [--system-tokens 2000] [--rounds 3]

A kvserve process is started with one slot (so that the RAM and disk tiers, not the
slot, have to serve), a 64 MB RAM tier (one 2,000-token state is about 46 MB, so a
second long prompt pushes the first to disk) and a disk tier in a temporary folder.
Each round uses a new system prompt; medians are printed as a markdown table.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.compare import free_port  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"


def start(config: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    log = open(f"/tmp/bench-prefix-cache-{port}.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "server", "--config", str(config), "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError("kvserve exited; see the log in /tmp")
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("kvserve did not start")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(60)


def system_prompt(words: int) -> str:
    tag = uuid.uuid4().hex[:8]
    lines = [f"Reference sheet {tag}."]
    for i in range(words // 12):
        item, depot, day = i * 7 % 97, i % 5, i % 7
        lines.append(f"Rule {i}: orders of item {item} ship from depot {depot} on day {day}.")
    return " ".join(lines)


def ttft(base: str, system: str, question: str, n: int = 1) -> tuple[float, int]:
    """Seconds to the first streamed token, and the cached tokens reported."""
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": 4,
        "temperature": 0,
        "n": n,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start_t = time.perf_counter()
    first, cached = None, -1
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            choices = chunk.get("choices") or [{}]
            # the first chunk carries only the role; time the first token
            produced = choices[0].get("delta", {}).get("content") or choices[0].get("finish_reason")
            if first is None and produced:
                first = time.perf_counter() - start_t
            if chunk.get("usage"):
                cached = chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert first is not None
    return first, cached


def prefilled(base: str) -> float:
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith("kvserve_prefilled_tokens_total{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--system-tokens", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="kvserve-bench-"))
    config = folder / "kvserve.toml"
    config.write_text(
        "[engine]\nn_seq_max = 1\nn_threads = 2\nembeddings = false\n"
        f'[cache]\nram_bytes = {64 << 20}\ndisk_dir = "{folder / "cache"}"\n'
        '[logging]\nlevel = "warning"\naccess_log = false\n'
    )
    words = int(args.system_tokens / 1.73)  # this sheet's words are 1.73 tokens each
    results: dict[str, list[float]] = {}
    cached: dict[str, list[int]] = {}

    def record(name: str, value: tuple[float, int]) -> None:
        results.setdefault(name, []).append(value[0])
        cached.setdefault(name, []).append(value[1])

    for _ in range(args.rounds):
        system, other = system_prompt(words), system_prompt(words)
        proc, base = start(config)
        try:
            record("cold", ttft(base, system, "Which depot ships item 3?"))
            record("warm in its slot", ttft(base, system, "Which depot ships item 5?"))
            ttft(base, "Say hi.", "Hi")  # the only slot now holds another prompt
            record("warm from RAM", ttft(base, system, "Which depot ships item 8?"))
            ttft(base, other, "Hello")  # a second long state pushes the first out of RAM
            record("warm from disk", ttft(base, system, "Which depot ships item 13?"))
        finally:
            stop(proc)
        proc, base = start(config)
        try:
            record("after a restart", ttft(base, system, "Which depot ships item 21?"))
        finally:
            stop(proc)

    cold = statistics.median(results["cold"])
    print(f"\n{args.system_tokens}-token system prompt, {args.rounds} rounds (medians)\n")
    print("| case | TTFT (s) | vs cold | cached tokens |")
    print("|---|---|---|---|")
    for name, values in results.items():
        median, tokens = statistics.median(values), statistics.median(cached[name])
        print(f"| {name} | {median:.3f} | 1/{cold / median:.0f} | {tokens:.0f} |")

    # n = 4: one prefill, forked, against the same prompt sent four times at once (each on
    # a fresh server, so nothing is warm).
    fork_config = folder / "fork.toml"
    fork_config.write_text(
        "[engine]\nn_seq_max = 4\nn_threads = 2\nembeddings = false\n[cache]\nenabled = false\n"
        '[logging]\nlevel = "warning"\naccess_log = false\n'
    )
    proc, base = start(fork_config)
    try:
        system = system_prompt(words)
        before = prefilled(base)
        t0 = time.perf_counter()
        ttft(base, system, "Which depot ships item 3?", n=4)
        fork_time, fork_tokens = time.perf_counter() - t0, prefilled(base) - before
    finally:
        stop(proc)
    proc, base = start(fork_config)  # a fresh server: nothing to reuse
    try:
        system = system_prompt(words)
        before = prefilled(base)
        t0 = time.perf_counter()
        with cf.ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda _: ttft(base, system, "Which depot ships item 3?"), range(4)))
        separate_time, separate_tokens = time.perf_counter() - t0, prefilled(base) - before
    finally:
        stop(proc)
    print("\n| n = 4 | prompt tokens prefilled | wall time (s) |")
    print("|---|---|---|")
    print(f"| one request, n=4 (fork) | {fork_tokens:.0f} | {fork_time:.2f} |")
    print(f"| four separate requests | {separate_tokens:.0f} | {separate_time:.2f} |")


if __name__ == "__main__":
    main()
