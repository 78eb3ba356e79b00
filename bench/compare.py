"""Side-by-side throughput run: kvserve vs llama-cpp-python's server, same model, same load.

    pip install -e '.[bench]'        # adds llama-cpp-python's [server] extra
    python bench/compare.py          # prints a markdown table

Each server is started on a free loopback port with the bundled SmolLM2-135M-Instruct
and 2 threads, warmed up with one request, then driven by bench/loadgen.py at each
concurrency; it is stopped before the next server starts, so they never share the CPU.
Add `llama-server` to --servers to include llama.cpp's C++ server: $LLAMA_SERVER when set,
else the one bench/llama_build.py builds (once, cached) from the installed
llama-cpp-python's sources; the binary, its version and flags are printed with the table.
Or pass --base-url NAME=URL for any server you started yourself.
kvserve variants add one setting to the defaults: kvserve-exact (exact_reuse on),
kvserve-spec (speculative decoding on by default), kvserve-fa / kvserve-nofa (flash attention
on / off), kvserve-q8 (a q8_0 KV cache); llama-server-nofa is llama-server with `-fa off`.
A kvserve name ending in `@DIR` runs the code of the checkout at DIR, for an A/B in one run:
    git worktree add /tmp/base 8f3b5ea
    python bench/compare.py --servers kvserve@/tmp/base,kvserve,llama-server --rounds 3
--interleave pairs the servers more tightly: all of them are started first, and each
round runs one concurrency on every server in turn (the order rotating from round to
round), so that what one server is compared with ran a minute before or after it, not
the whole run. Only the server under load runs: the others are stopped (SIGSTOP), so
they use no CPU at all. Either way the table ends with each server's ratios to the last
one named (llama-server where named), round by round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import llama_build  # noqa: E402
from bench.loadgen import run_load  # noqa: E402
from bench.paired import all_started, in_turn, paired_ratios, reference_of, resumed  # noqa: E402
from engine.llama import cpu_has_amx  # noqa: E402
from server.config.model_entries import ModelSection  # noqa: E402
from server.config.tree import default_model_path  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# kvserve variants: the default configuration plus one setting (environment overrides).
KVSERVE_VARIANTS = {
    "kvserve": {},
    "kvserve-exact": {"KVSERVE_ENGINE_EXACT_REUSE": "true"},
    "kvserve-spec": {"KVSERVE_ENGINE_SPECULATIVE": "true"},
    "kvserve-fa": {"KVSERVE_ENGINE_FLASH_ATTN": "true"},
    "kvserve-nofa": {"KVSERVE_ENGINE_FLASH_ATTN": "false"},
    "kvserve-nofa-exact": {
        "KVSERVE_ENGINE_FLASH_ATTN": "false",
        "KVSERVE_ENGINE_EXACT_REUSE": "true",
    },
    "kvserve-fast": {"KVSERVE_ENGINE_EXACT_REUSE": "false"},
    "kvserve-q8": {"KVSERVE_ENGINE_TYPE_K": "q8_0", "KVSERVE_ENGINE_TYPE_V": "q8_0"},
    # one KV pool of as many cells as the slots' streams have together (start() sizes it)
    "kvserve-unified": {"KVSERVE_ENGINE_KV_UNIFIED": "true"},
}


def bench_model() -> tuple[str, str]:
    """The GGUF every server of a run loads, and the name kvserve serves it under:
    $KVSERVE_BENCH_MODEL (e.g. Gemma 3 270M for the second family), else the bundled one."""
    path = os.environ.get("KVSERVE_BENCH_MODEL") or default_model_path()
    return path, ModelSection(path=path).id


def gpu_layers_wanted() -> int:
    """Layers every server of a run offloads to the GPU: $BENCH_N_GPU_LAYERS (a CUDA build,
    bench/gpu_check.sh), else 0: the CPU run all other figures are."""
    return int(os.environ.get("BENCH_N_GPU_LAYERS") or 0)


def start(
    name: str,
    threads: int,
    parallel: int,
    n_ctx: int = 4096,
    cache_dir: str | None = None,
    chat_template: str | None = None,
    mmproj: str | None = None,
) -> tuple[subprocess.Popen, str, str]:
    """Start server `name` with `parallel` slots of `n_ctx` tokens each; kvserve's disk tier
    lives in `cache_dir` when given (else it has none: each run starts cold). A Jinja file
    `chat_template` replaces the model's own template on kvserve and llama-server alike (the
    same prompt on both: a template with tool syntax, where the model's has none). A kvserve name
    may end in `@DIR`: that checkout's code is run (an A/B against another commit, e.g. a
    `git worktree` of it), on this environment's packages. `mmproj`: a vision projector GGUF
    both load (kvserve as its model entry's `mmproj`, llama-server with `--mmproj`)."""
    port = free_port()
    name, _, source = name.partition("@")
    model, kvserve_id = bench_model()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSERVE_ENGINE_")}
    gpu_layers = gpu_layers_wanted()
    if name in KVSERVE_VARIANTS:
        env.update(KVSERVE_VARIANTS[name])
        if env.get("KVSERVE_ENGINE_KV_UNIFIED") == "true":
            n_ctx *= parallel  # one pool: the cells of every slot's stream
        if gpu_layers:
            env["KVSERVE_ENGINE_N_GPU_LAYERS"] = str(gpu_layers)
        cmd = [
            sys.executable,
            "-m",
            "server",
            "--port",
            str(port),
            "--threads",
            str(threads),
            "--parallel",
            str(parallel),
            "--log-level",
            "warning",
            "--n-ctx",
            str(n_ctx),
            "--model",
            model,
        ]
        if chat_template:
            cmd += ["--chat-template", chat_template]
        if mmproj:
            env["KVSERVE_MODEL_MMPROJ"] = mmproj
        if cache_dir is None:
            cmd.append("--no-disk-cache")  # each run starts cold, not warm from the last's disk
        else:
            env["KVSERVE_CACHE_DISK_DIR"] = cache_dir
        model_id = kvserve_id
    elif name == "llama_cpp.server":
        script = str(Path(__file__).resolve().parent / "peer_llama_cpp_server.py")
        cmd = [
            sys.executable,
            script,
            "--model",
            model,
            "--port",
            str(port),
            "--n_threads",
            str(threads),
            "--n_threads_batch",
            str(threads),
            "--n_ctx",
            str(n_ctx),
            # serve concurrent requests one after another instead of cancelling the
            # running one when the next arrives (the peer's default)
            "--interrupt_requests",
            "False",
        ]
        model_id = model
    elif name in ("llama-server", "llama-server-nofa"):
        # llama.cpp's own C++ server ($LLAMA_SERVER, else bench/llama_build.py's build),
        # with kvserve's weight setting: no repacked weights on an AMX CPU (the
        # workaround kvserve's extra_bufts = "auto" applies), repacked elsewhere.
        peer = llama_build.peer_server()
        print(peer.description, file=sys.stderr)
        cmd = [
            str(peer.path),
            "-m",
            model,
            "--port",
            str(port),
            "-np",
            str(parallel),
            "-t",
            str(threads),
            "-tb",
            str(threads),
            "-c",
            str(n_ctx * parallel),
            *(["--no-repack"] if cpu_has_amx() else []),
            *(["-fa", "off"] if name == "llama-server-nofa" else []),
            "-ngl",  # explicit: llama-server's default offloads what fits to a GPU
            str(gpu_layers),
            *(["--jinja", "--chat-template-file", chat_template] if chat_template else []),
            *(["--mmproj", mmproj] if mmproj else []),
        ]
        model_id = model
    else:
        raise ValueError(name)
    if chat_template and name == "llama_cpp.server":
        raise ValueError("--chat-template: not passed to llama_cpp.server")
    if mmproj and name == "llama_cpp.server":
        raise ValueError("mmproj: not passed to llama_cpp.server")
    if source and name not in KVSERVE_VARIANTS:
        raise ValueError(f"{name}@{source}: only kvserve's variants run from another checkout")
    log_name = name + (f"@{Path(source).name}" if source else "")
    log = open(f"/tmp/bench-{log_name}.log", "w")  # noqa: SIM115
    # `python -m server` imports from its working directory first
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=source or None)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}")
        try:
            # /health is 200 only once the model is loaded (llama_cpp.server has none)
            probe = "/v1/models" if name == "llama_cpp.server" else "/health"
            if httpx.get(f"{base}{probe}", timeout=1).status_code == 200:
                return proc, f"{base}/v1", model_id
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{name} did not start")


def warm_up(base_url: str, model_id: str, args: argparse.Namespace) -> None:
    asyncio.run(run_load(base_url, model_id, 1, 2, args.prompt_words, 8, {}))


def load(
    label: str, base_url: str, model_id: str, concurrency: int, args: argparse.Namespace
) -> dict:
    report = asyncio.run(
        run_load(
            base_url,
            model_id,
            concurrency,
            args.requests,
            args.prompt_words,
            args.max_tokens,
            {},
        )
    )
    report["server"] = label
    print(json.dumps(report), file=sys.stderr)
    return report


def measure(label: str, base_url: str, model_id: str, args: argparse.Namespace) -> list[dict]:
    warm_up(base_url, model_id, args)
    return [load(label, base_url, model_id, c, args) for c in args.concurrency]


def sequential(names: list[str], args: argparse.Namespace) -> list[dict]:
    """Each round starts each server alone, runs every concurrency on it and stops it."""
    rows: list[dict] = []
    for round_ in range(args.rounds):  # alternating rounds: drift hits every server
        for name in names:
            proc, base_url, model_id = start(name, args.threads, args.parallel)
            try:
                rows += [{**r, "round": round_} for r in measure(name, base_url, model_id, args)]
            finally:
                proc.terminate()
                proc.wait(30)
        for item in args.base_url:
            label, url = item.split("=", 1)
            model = os.environ.get("BENCH_MODEL", "SmolLM2-135M-Instruct")
            rows += [{**r, "round": round_} for r in measure(label, url, model, args)]
    return rows


def interleaved(names: list[str], args: argparse.Namespace) -> list[dict]:
    """All servers started first; each round runs one concurrency on each in turn, the
    order rotating by round. The servers not under load are stopped (SIGSTOP)."""
    rows: list[dict] = []

    def launch(name: str) -> tuple[subprocess.Popen, str, str]:
        return start(name, args.threads, args.parallel)

    def warm(base_url: str, model_id: str) -> None:
        warm_up(base_url, model_id, args)

    with all_started(names, launch, warm) as servers:
        for round_ in range(args.rounds):
            for concurrency in args.concurrency:
                for name, proc, base_url, model_id in in_turn(servers, round_):
                    with resumed(proc):
                        report = load(name, base_url, model_id, concurrency, args)
                    rows.append({**report, "round": round_})
    return rows


def medians(rows: list[dict]) -> list[dict]:
    """One row per server and concurrency: the median round by throughput."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["server"], r["concurrency"]), []).append(r)
    out = []
    for group in groups.values():
        group.sort(key=lambda r: r["output_tok_s"])
        median = dict(group[len(group) // 2])
        median["rounds"] = [r["output_tok_s"] for r in group]
        out.append(median)
    return out


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--servers", default="kvserve,llama_cpp.server")
    p.add_argument("--base-url", action="append", default=[], help="NAME=URL of a running server")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--prompt-words", type=int, default=20)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--parallel", type=int, default=8)
    p.add_argument("--rounds", type=int, default=1, help="alternate the servers this many times")
    p.add_argument(
        "--interleave",
        action="store_true",
        help="start every server first; a round runs one concurrency on each in turn",
    )
    p.add_argument("--chart", help="write a PNG of throughput and TTFT (needs matplotlib)")
    args = p.parse_args()
    names = [s for s in args.servers.split(",") if s]
    if args.interleave and args.base_url:
        p.error("--interleave starts (and stops) its servers itself: no --base-url")
    rows = interleaved(names, args) if args.interleave else sequential(names, args)
    labels = names + [item.split("=", 1)[0] for item in args.base_url]
    ratios = paired_ratios(rows, reference_of(labels))
    rows = medians(rows)
    if args.chart:
        from bench.chart import throughput_and_ttft

        throughput_and_ttft(
            rows, args.chart, f"{args.requests} chat requests, medians of {args.rounds}"
        )
    print(
        "| server | concurrency | output tok/s | rounds | TTFT p50 | TTFT p95 | ITL p50 | ITL p95 "
        "| errors |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['server']} | {r['concurrency']} | {r['output_tok_s']} | {r['rounds']} | "
            f"{r['ttft_p50_s']} s | "
            f"{r['ttft_p95_s']} s | {r['itl_p50_ms']} ms | {r['itl_p95_ms']} ms | {r['errors']} |"
        )
    print()
    for line in ratios:
        print(f"- {line}")
    print_peer(names)


def print_peer(names: list[str]) -> None:
    """Say which llama-server a table was measured against: ratios hold only for that build."""
    if any(n.startswith("llama-server") for n in names):
        print(llama_build.peer_server().description)


if __name__ == "__main__":
    main()
