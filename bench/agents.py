"""Agents that outnumber slots: a shared tool catalogue, a task each, a tool result a turn.

    python bench/agents.py --servers kvserve,llama-server --agents 16 --slots 4 --turns 4
    python bench/agents.py --shape long-catalogue     # 6 x 3 on 2 slots, ~8k-token catalogue

Named shapes (--shape, bench/agent_workloads.py): default (16 agents x 4 turns, 4 slots),
large (24 x 3, 6 slots), wide (32 x 2, 8 slots), long-catalogue (6 x 3, 2 slots, an
~8k-token system prompt, kvserve with its RAM and disk tiers); a flag overrides its part.

llama-server is $LLAMA_SERVER when set, else the build of bench/llama_build.py (made once
from the installed llama-cpp-python's sources); the binary and its flags are printed.

Every agent sends, turn after turn, its whole conversation again: the system prompt (a
catalogue of tool definitions shared by all agents), its own task, then for each earlier
turn the reply it got and a tool result (new words). All agents run at once, more of
them than the server has slots; each request is a streamed greedy chat completion on a
fresh connection. Each server is started alone on a free port (bench/compare.py's
`start`), so they never share the CPU.

Reported per server: wall time, TTFT p50 of turn 1 and of the later turns, and the
prompt tokens the server computed (its prompt minus what it reports as cached:
`usage.prompt_tokens_details.cached_tokens`, or llama-server's `timings.prompt_n`).
Printed once per run: the workload's floor, the tokens no reuse can avoid (the catalogue
once, each task once, each turn's new text once), and what the floor would cost cold
on each server (its cold prefill rate times the floor, plus the decode measured here).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import llama_build  # noqa: E402
from bench.agent_workloads import SHAPES, Shape, Workload, make_workload, words  # noqa: E402
from bench.compare import print_peer, start  # noqa: E402
from bench.loadgen import content_of, sse_objects  # noqa: E402


@dataclass
class Turn:
    agent: int
    turn: int
    ttft: float
    prompt: int
    computed: int
    completion: int


async def ask(
    base: str, model: str, messages: list[dict], max_tokens: int
) -> tuple[float, str, int, int, int]:
    """One streamed greedy request on a fresh connection: TTFT, text, prompt, computed,
    completion tokens."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first: float | None = None
    text, prompt, computed, completion = "", 0, -1, 0
    async with (
        httpx.AsyncClient(base_url=base, timeout=3600) as client,
        client.stream("POST", "/chat/completions", json=body) as r,
    ):
        r.raise_for_status()
        async for data in sse_objects(r):
            delta = content_of(data)
            if delta:
                first = first if first is not None else time.perf_counter() - started
                text += delta
            if data.get("timings"):  # llama-server: prompt_n = tokens it computed
                computed = int(data["timings"].get("prompt_n", computed))
            usage = data.get("usage")
            if usage:
                prompt = int(usage["prompt_tokens"])
                completion = int(usage["completion_tokens"])
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                if cached is not None and computed < 0:
                    computed = prompt - int(cached)
    ttft = first if first is not None else time.perf_counter() - started
    return ttft, text, prompt, computed, completion


async def agent(
    base: str, model: str, work: Workload, index: int, args: argparse.Namespace
) -> list[Turn]:
    messages = [
        {"role": "system", "content": work.system},
        {"role": "user", "content": work.tasks[index]},
    ]
    turns = []
    for t in range(1, args.turns + 1):
        ttft, text, prompt, computed, completion = await ask(
            base, model, messages, args.reply_tokens
        )
        turns.append(Turn(index, t, ttft, prompt, computed, completion))
        messages.append({"role": "assistant", "content": text})
        messages.append({"role": "user", "content": work.results[index][t - 1]})
    return turns


async def run_agents(base: str, model: str, work: Workload, args: argparse.Namespace) -> dict:
    started = time.perf_counter()
    per_agent = await asyncio.gather(
        *(agent(base, model, work, a, args) for a in range(args.agents))
    )
    wall = time.perf_counter() - started
    turns = [t for ts in per_agent for t in ts]
    later = [t.ttft for t in turns if t.turn > 1] or [float("nan")]
    return {
        "wall_s": round(wall, 2),
        "ttft_p50_turn1_s": round(statistics.median(t.ttft for t in turns if t.turn == 1), 3),
        "ttft_p50_later_s": round(statistics.median(later), 3),
        "prompt_tokens": sum(t.prompt for t in turns),
        "computed_tokens": sum(max(0, t.computed) for t in turns),
        "completion_tokens": sum(t.completion for t in turns),
        "floor_tokens": floor_tokens(base, work, per_agent),
    }


def floor_tokens(base: str, work: Workload, per_agent: list[list[Turn]]) -> int:
    """The catalogue once, each agent's first prompt past the catalogue once, and each later
    turn's prompt past the previous prompt and its reply (which was decoded, so its KV
    exists): the tokens that no reuse can avoid."""
    root = base.removesuffix("/v1")
    shared = len(httpx.post(f"{root}/tokenize", json={"content": work.system}).json()["tokens"])
    total = shared
    for turns in per_agent:
        total += max(0, turns[0].prompt - shared)
        for prev, cur in zip(turns, turns[1:], strict=False):
            total += max(0, cur.prompt - prev.prompt - prev.completion)
    return total


async def cold_rates(base: str, model: str, args: argparse.Namespace) -> dict:
    """Prefill and decode rates at `slots` concurrency (unique prompts computed cold, then
    the same prompts again for their replies): what the floor would cost if it were all
    the server had to compute."""
    rng = random.Random(args.seed + 1)
    size = args.catalogue_words + args.task_words
    prompts = [[{"role": "user", "content": f"{i} {words(rng, size)}"}] for i in range(args.slots)]

    async def phase(max_tokens: int) -> tuple[float, int, int]:
        t0 = time.perf_counter()
        done = await asyncio.gather(*(ask(base, model, m, max_tokens) for m in prompts))
        prompt = sum(prompt for _, _, prompt, _, _ in done)
        return time.perf_counter() - t0, prompt, sum(completion for *_, completion in done)

    prefill_s, prompt_tokens, _ = await phase(1)
    # The same prompts again: both servers find them cached, so this phase is decode
    # alone. (Subtracting a second prefill's time instead swung the rate 2.5x run to run.)
    decode_s, _, completion_tokens = await phase(args.reply_tokens * 4)
    return {
        "prefill_tok_s": prompt_tokens / prefill_s,
        "decode_tok_s": completion_tokens / decode_s,
    }


# The engine and cache counters that explain a run (see docs/operations.md "Metrics").
COUNTERS = (
    "kvserve_engine_steps_total",
    "kvserve_prefilled_tokens_total",
    "kvserve_sampled_tokens_total",
    "kvserve_cache_requests_total",
    "kvserve_cache_request_sources_total",
    "kvserve_cache_saves_total",
    "kvserve_cache_saves_dropped_total",
    "kvserve_preemptions_total",
)


def print_counters(base: str) -> None:
    text = httpx.get(base.removesuffix("/v1") + "/metrics").text
    for line in text.splitlines():
        if line.startswith(COUNTERS):
            print("   ", line, file=sys.stderr)


def prefix_sources(base: str) -> dict[str, int]:
    """Where kvserve found each request's prefix (none / slot / ram / disk): on the
    long-catalogue shape the tiers, not the slots, should carry the later turns."""
    found: dict[str, int] = {}
    for line in httpx.get(base.removesuffix("/v1") + "/metrics").text.splitlines():
        if line.startswith("kvserve_cache_request_sources_total{"):
            source = line.split('source="', 1)[1].split('"', 1)[0]
            found[source] = found.get(source, 0) + int(float(line.rsplit(" ", 1)[1]))
    return found


def resolve_shape(args: argparse.Namespace) -> Shape:
    """Fill every workload flag left unset from the named shape; the shape as run."""
    base = SHAPES[args.shape]
    for name in ("agents", "turns", "slots", "catalogue_words", "task_words", "result_words",
                 "reply_tokens", "n_ctx", "disk_cache"):  # fmt: skip
        if getattr(args, name) is None:
            setattr(args, name, getattr(base, name))
    return base


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--servers", default="kvserve,llama-server")
    p.add_argument("--shape", choices=SHAPES, default="default",
                   help="a named workload (bench/agent_workloads.py); the flags below "
                        "override its parts")  # fmt: skip
    # The words are syllable pairs of about 2 tokens each: the default shape makes an
    # ~810-token catalogue, ~160-token tasks and ~42-token tool results (the shape:
    # an 800-token catalogue, 120-word tasks, 30-word results).
    p.add_argument("--agents", type=int)
    p.add_argument("--slots", type=int)
    p.add_argument("--turns", type=int)
    p.add_argument("--catalogue-words", type=int, help="default shape: 300, about 810 tokens")
    p.add_argument("--task-words", type=int, help="default shape: 75, about 160 tokens")
    p.add_argument("--result-words", type=int, help="default shape: 20, about 42 tokens")
    p.add_argument("--reply-tokens", type=int)
    p.add_argument("--n-ctx", type=int, help="context of one slot, on every server")
    p.add_argument("--disk-cache", action=argparse.BooleanOptionalAction,
                   help="kvserve with its disk tier (a fresh directory) beside RAM")  # fmt: skip
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--json", help="append each server's row to this JSON-lines file")
    p.add_argument("--chart", help="draw wall time, TTFT and tokens computed to this PNG")
    p.add_argument(
        "--metrics",
        action="store_true",
        help="print kvserve's engine and cache counters after each kvserve run",
    )
    args = p.parse_args()
    resolve_shape(args)
    work = make_workload(args.seed, args.agents, args.turns, args.catalogue_words,
                         args.task_words, args.result_words)  # fmt: skip
    rows = []
    for name in [s for s in args.servers.split(",") if s]:
        cache_dir = tempfile.mkdtemp(prefix="kvserve-agents-") if args.disk_cache else None
        proc, base, model = start(name, args.threads, args.slots, args.n_ctx, cache_dir)
        try:
            asyncio.run(ask(base, model, [{"role": "user", "content": "hi"}], 4))  # warm-up
            row = {"server": name, **asyncio.run(run_agents(base, model, work, args))}
            if name.startswith("llama-server"):
                row["build"] = llama_build.peer_server().description
            else:  # before the cold-rate requests below count into them
                row["prefix_sources"] = prefix_sources(base)
                if args.metrics or args.disk_cache:
                    print_counters(base)
            rates = asyncio.run(cold_rates(base, model, args))
            row["floor_cost_s"] = round(
                row["floor_tokens"] / rates["prefill_tok_s"]
                + row["completion_tokens"] / rates["decode_tok_s"],
                2,
            )
            row.update({k: round(v, 1) for k, v in rates.items()})
        finally:
            proc.terminate()
            proc.wait(30)
            if cache_dir:
                shutil.rmtree(cache_dir, ignore_errors=True)
        print(json.dumps(row), file=sys.stderr)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps({**vars(args), **row}) + "\n")
        rows.append(row)
    title = (
        f"shape {args.shape}: {args.agents} agents x {args.turns} turns, {args.slots} slots, "
        f"{args.catalogue_words}-word catalogue, {args.reply_tokens}-token replies, "
        f"n_ctx {args.n_ctx}" + (", kvserve with RAM and disk tiers" if args.disk_cache else "")
    )
    print(title)
    if args.chart:
        from bench.chart import agents_panels

        agents_panels(rows, args.chart, title)
    print(
        "| server | wall | TTFT p50 turn 1 | TTFT p50 turns 2+ | computed / prompt tokens "
        "| floor tokens | floor cost |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['server']} | {r['wall_s']} s | {r['ttft_p50_turn1_s']} s | "
            f"{r['ttft_p50_later_s']} s | {r['computed_tokens']} / {r['prompt_tokens']} | "
            f"{r['floor_tokens']} | {r['floor_cost_s']} s |"
        )
    for r in rows:
        if "prefix_sources" in r:  # the warm-up request counts as one "none"
            print(f"{r['server']}: prefixes found in {r['prefix_sources']}")
    print_peer([r["server"] for r in rows])


if __name__ == "__main__":
    main()
