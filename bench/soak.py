"""Memory over time: a real kvserve under a mixed load for half an hour, its RSS sampled.

    pip install -e '.[bench]'          # matplotlib, for the chart
    python bench/soak.py --minutes 30 --png bench/charts/soak.png --csv soak.csv

Starts `python -m server` on a free loopback port with the bundled default model,
sessions on (the default), its disk tier in a fresh temporary directory and a small RAM
tier (`--ram-mib`, 128 by default) so that older prefixes move to disk and repeated
prompts are restored from both tiers. Then `--clients` clients (4) send a bounded mix of
chat completions, session turns, tool calls, embeddings, Responses chains and Messages
(bench/soak_load.py) on `--topics` (24) long system prompts for `--minutes`, and the
server stops by itself at the end. `--server-env NAME=VALUE` sets an environment
variable of the server (e.g. MALLOC_ARENA_MAX=2, to see what glibc's arenas account for).

Every `--interval` seconds (10) it samples the server's non-file RSS, RssAnon + RssShmem
from /proc/PID/status: the memory the process itself allocated (heaps, llama.cpp's KV
and compute buffers, the RAM tier, Python objects). File-backed RSS (RssFile) is left
out: it is mostly the mmapped GGUF weights and shared libraries, page cache the kernel
maps in as the model is read and may drop under pressure from other processes; it
tracks the machine's memory pressure, not what the server keeps. It is still written to
the CSV. Each sample also records the RAM tier's bytes, the disk tier's entries, where
requests' reused tokens came from (/metrics: slot, ram, disk) and the requests so far.

Warm-up is the first `--warmup-minutes` (5) of load: slots, the RAM tier, allocator
arenas and grammar memos reach their working size (the chart shows whether the RAM tier
reached its budget within it: the load's distinct prefixes outgrow 128 MiB). After
it the run prints the RSS at its end, the min and max, and the drift: the mean of the
last `--window-minutes` (5) against the mean of the first ones after warm-up, in %
(windows are shortened to half the post-warm-up span on short runs). The same figures
are given for RSS less the RAM tier's bytes, the part not bounded by a cache budget.
Exit status 1 when a request failed or a kind of request was never answered.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.soak_load import TOPICS, Tally, run_clients  # noqa: E402
from tests.kvserve_process import MODEL, Server, running  # noqa: E402

MIB = 1 << 20
COLUMNS = [
    "t_s", "rss_anon_kib", "rss_shmem_kib", "rss_file_kib", "nonfile_rss_mib",
    "ram_tier_mib", "nonfile_less_ram_tier_mib", "disk_tier_entries",
    "reused_from_slot", "reused_from_ram", "reused_from_disk", "requests_ok", "requests_failed",
]  # fmt: skip


def proc_status(pid: int) -> dict[str, int]:
    """The Rss* and Vm* lines of /proc/PID/status, in KiB."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name.startswith(("Rss", "Vm")) and value.strip().endswith("kB"):
            out[name] = int(value.split()[0])
    return out


async def scrape(http: httpx.AsyncClient) -> dict[str, float]:
    """/metrics samples by name and non-model labels, e.g. 'kvserve_cache_bytes{tier=ram}'."""
    from prometheus_client.parser import text_string_to_metric_families

    text = (await http.get("/metrics", timeout=30)).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model")
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def sample(t: float, pid: int, metrics: dict[str, float], tally: Tally) -> dict[str, Any]:
    status = proc_status(pid)
    nonfile = (status.get("RssAnon", 0) + status.get("RssShmem", 0)) / 1024
    ram_tier = metrics.get("kvserve_cache_bytes{tier=ram}", 0.0) / MIB
    source = "kvserve_cache_request_sources_total{{source={}}}"
    return {
        "t_s": round(t, 1),
        "rss_anon_kib": status.get("RssAnon", 0),
        "rss_shmem_kib": status.get("RssShmem", 0),
        "rss_file_kib": status.get("RssFile", 0),
        "nonfile_rss_mib": round(nonfile, 1),
        "ram_tier_mib": round(ram_tier, 1),
        "nonfile_less_ram_tier_mib": round(nonfile - ram_tier, 1),
        "disk_tier_entries": int(metrics.get("kvserve_cache_entries{tier=disk}", 0)),
        **{
            f"reused_from_{s}": int(metrics.get(source.format(s), 0))
            for s in ("slot", "ram", "disk")
        },
        "requests_ok": tally.num_ok,
        "requests_failed": tally.num_failed,
    }


def progress(row: dict[str, Any]) -> str:
    return (
        f"{row['t_s'] / 60:6.1f} min  non-file RSS {row['nonfile_rss_mib']:7.1f} MiB  "
        f"RAM tier {row['ram_tier_mib']:6.1f} MiB  requests {row['requests_ok']}  "
        f"failed {row['requests_failed']}"
    )


async def soak(server: Server, args: argparse.Namespace, tally: Tally) -> list[dict[str, Any]]:
    """Run the load and sample every `args.interval` s (a row at 0 s, before any load).
    Stops early, the load cancelled, if the server exits."""
    rows: list[dict[str, Any]] = []
    with open(args.csv, "w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        async with httpx.AsyncClient(base_url=server.url) as http:

            async def take(t: float) -> None:
                rows.append(sample(t, server.process.pid, await scrape(http), tally))
                writer.writerow(rows[-1])
                f.flush()  # a run cut short still leaves its samples

            start = time.monotonic()
            await take(0.0)
            print(progress(rows[-1]), flush=True)
            load = asyncio.create_task(run_clients(server.url, MODEL, args, tally))
            while not load.done():
                await asyncio.wait(
                    {load}, timeout=args.interval - (time.monotonic() - start) % args.interval
                )
                if server.process.poll() is not None:
                    print(f"kvserve exited with {server.process.returncode}", flush=True)
                    load.cancel()
                    await asyncio.gather(load, return_exceptions=True)
                    return rows
                await take(time.monotonic() - start)
                print(progress(rows[-1]), flush=True)
            load.result()
    return rows


def summarize(
    rows: list[dict[str, Any]], column: str, args: argparse.Namespace
) -> dict[str, float]:
    """RSS at the end of warm-up, min/max after it, and the drift between the first and
    the last window after it (in %). Empty when no sample falls after warm-up."""
    after = [r for r in rows if r["t_s"] >= args.warmup_minutes * 60]
    if len(after) < 2:
        return {}
    t0, t1 = after[0]["t_s"], after[-1]["t_s"]
    window = min(args.window_minutes * 60, (t1 - t0) / 2)
    first = [r[column] for r in after if r["t_s"] <= t0 + window]
    last = [r[column] for r in after if r["t_s"] >= t1 - window]
    values = [r[column] for r in after]
    mean_first, mean_last = statistics.fmean(first), statistics.fmean(last)
    return {
        "at_warmup_end": after[0][column], "min": min(values), "max": max(values),
        "window_min": window / 60, "mean_first": mean_first, "mean_last": mean_last,
        "drift_pct": 100 * (mean_last - mean_first) / mean_first,
    }  # fmt: skip


def chart(rows: list[dict[str, Any]], summary: dict[str, float], args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [r["t_s"] / 60 for r in rows]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.plot(
        minutes, [r["nonfile_rss_mib"] for r in rows], label="non-file RSS (RssAnon + RssShmem)"
    )
    ax.plot(
        minutes,
        [r["nonfile_less_ram_tier_mib"] for r in rows],
        label="non-file RSS less the RAM tier",
    )
    ax.plot(
        minutes, [r["ram_tier_mib"] for r in rows], label="RAM tier (cache bytes)", linestyle=":"
    )
    ax.axvspan(0, args.warmup_minutes, color="0.9", label="warm-up")
    if summary:
        for bound in (0.95, 1.05):
            ax.axhline(summary["mean_first"] * bound, color="0.5", linestyle="--", linewidth=0.8)
        title = (
            f"drift after warm-up {summary['drift_pct']:+.1f}% (dashed: ±5% of the first window)"
        )
    else:
        title = "no samples after warm-up"
    ax.set(xlabel="minutes", ylabel="MiB", ylim=(0, None), title=f"kvserve soak: {title}")
    ax.legend(loc="center right", fontsize=8)
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    plt.close(fig)


def report(rows: list[dict[str, Any]], tally: Tally, args: argparse.Namespace) -> int:
    print(f"\nWarm-up: the first {args.warmup_minutes:g} min of load; "
          f"samples every {args.interval:g} s")  # fmt: skip
    summaries = {}
    for column, label in [("nonfile_rss_mib", "non-file RSS"),
                          ("nonfile_less_ram_tier_mib", "non-file RSS less RAM tier")]:  # fmt: skip
        s = summaries[column] = summarize(rows, column, args)
        if not s:
            print(f"{label}: no samples after warm-up")
            continue
        print(f"{label}: {s['at_warmup_end']:.1f} MiB after warm-up, min {s['min']:.1f}, "
              f"max {s['max']:.1f}; drift {s['drift_pct']:+.2f}% ({s['window_min']:.1f}-min "
              f"windows: {s['mean_first']:.1f} -> {s['mean_last']:.1f} MiB)")  # fmt: skip
    first, last = rows[0], rows[-1]
    print(f"at start (before load): non-file RSS {first['nonfile_rss_mib']:.1f} MiB, "
          f"file RSS {first['rss_file_kib'] / 1024:.1f} MiB; at the end: file RSS "
          f"{last['rss_file_kib'] / 1024:.1f} MiB, RAM tier {last['ram_tier_mib']:.1f} MiB, "
          f"disk tier {last['disk_tier_entries']} entries")  # fmt: skip
    print(
        "requests whose reused tokens came from: "
        + ", ".join(f"{s} {last[f'reused_from_{s}']}" for s in ("slot", "ram", "disk"))
    )
    print("\nkind             sent      ok  failed")
    for kind in sorted(tally.sent):
        print(f"{kind:<14} {tally.sent[kind]:>6} {tally.ok[kind]:>7} {tally.failed[kind]:>7}")
    print(f"{'all':<14} {sum(tally.sent.values()):>6} {tally.num_ok:>7} {tally.num_failed:>7}")
    for text in tally.samples:
        print("  failure:", text)
    chart(rows, summaries["nonfile_rss_mib"], args)
    print(f"\nCSV: {args.csv}\nchart: {args.png}")
    unanswered = [k for k in tally.sent if tally.ok[k] == 0]
    if unanswered:
        print("never answered:", ", ".join(unanswered))
    no_restores = [s for s in ("ram", "disk") if last[f"reused_from_{s}"] == 0]
    if no_restores:
        print("note: no request was restored from", " or ".join(no_restores))
    return 1 if tally.num_failed or unanswered or not args.server_alive else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30.0, help="load duration")
    p.add_argument("--warmup-minutes", type=float, default=5.0)
    p.add_argument("--window-minutes", type=float, default=5.0, help="drift: first vs last window")
    p.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    p.add_argument("--clients", type=int, default=4, help="concurrent clients")
    p.add_argument("--threads", type=int, default=0, help="server CPU threads (0: all cores)")
    p.add_argument("--ram-mib", type=int, default=128, help="the server's RAM tier budget")
    p.add_argument("--disk-mib", type=int, default=2048, help="the server's disk tier budget")
    p.add_argument("--timeout", type=float, default=300.0, help="client timeout of a request")
    p.add_argument(
        "--topics",
        type=int,
        default=len(TOPICS),
        choices=range(1, len(TOPICS) + 1),
        metavar=f"1-{len(TOPICS)}",
        help="distinct system prompts (cache heads)",
    )
    p.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable of the server (repeatable)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--csv", type=Path, default=Path("soak.csv"))
    p.add_argument("--png", type=Path, default=Path("soak.png"))
    args = p.parse_args()
    if min(args.minutes, args.interval, args.clients, args.timeout) <= 0:
        p.error("--minutes, --interval, --clients and --timeout must be positive")
    env = {"KVSERVE_CACHE_RAM_BYTES": str(args.ram_mib * MIB),
           "KVSERVE_CACHE_DISK_BYTES": str(args.disk_mib * MIB)}  # fmt: skip
    for item in args.server_env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            p.error(f"--server-env wants NAME=VALUE, got {item!r}")
        env[name] = value
    server_args = ["--threads", str(args.threads), "--log-level", "warning"]
    tally = Tally()
    with tempfile.TemporaryDirectory(prefix="kvserve-soak-") as tmp:
        # the disk tier lives in tmp too (running() points XDG_CACHE_HOME there)
        with running(server_args, Path(tmp), env=env) as server:
            print(f"kvserve pid {server.process.pid} at {server.url}; "
                  f"{args.clients} clients for {args.minutes:g} min", flush=True)  # fmt: skip
            rows = asyncio.run(soak(server, args, tally))
            args.server_alive = server.process.poll() is None
            log = server.log()
        if not args.server_alive or tally.num_failed:
            print("server log (last 40 lines):\n" + "\n".join(log.splitlines()[-40:]))
    return report(rows, tally, args)


if __name__ == "__main__":
    sys.exit(main())
