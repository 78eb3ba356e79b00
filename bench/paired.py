"""Servers compared round by round on a machine whose speed drifts: all of them up at
once, only the one under load running (the others stopped with SIGSTOP, so they use no
CPU), the order rotating by round, and each figure divided by the reference server's in
the same round. Used by bench/compare.py --interleave and bench/decode_pairs.py."""

from __future__ import annotations

import contextlib
import signal
import statistics
import subprocess
from collections.abc import Callable, Iterator

Started = tuple[str, subprocess.Popen, str, str]  # name, process, base URL, model id


@contextlib.contextmanager
def all_started(
    names: list[str],
    launch: Callable[[str], tuple[subprocess.Popen, str, str]],
    warm: Callable[[str, str], object],
) -> Iterator[list[Started]]:
    """Every server started (`launch(name)`: bench/compare.py's `start`) and warmed
    (`warm(base_url, model_id)`), then stopped (SIGSTOP) until `resumed`; all of them
    ended on the way out."""
    servers: list[Started] = []
    try:
        for name in names:
            proc, base_url, model_id = launch(name)
            servers.append((name, proc, base_url, model_id))
            warm(base_url, model_id)
            proc.send_signal(signal.SIGSTOP)
        yield servers
    finally:
        for _, proc, _, _ in servers:
            proc.send_signal(signal.SIGCONT)
            proc.terminate()
            proc.wait(30)


@contextlib.contextmanager
def resumed(proc: subprocess.Popen) -> Iterator[None]:
    """The one server under load runs; it is stopped again after."""
    proc.send_signal(signal.SIGCONT)
    try:
        yield
    finally:
        proc.send_signal(signal.SIGSTOP)


def in_turn(servers: list[Started], round_: int) -> list[Started]:
    """The servers in this round's order: each round starts one further along."""
    turn = round_ % len(servers)
    return servers[turn:] + servers[:turn]


def reference_of(labels: list[str]) -> str:
    """The server every other one is divided by: llama-server where named, else the last."""
    return next((n for n in labels if n.startswith("llama-server")), labels[-1])


def paired_ratios(rows: list[dict], reference: str) -> list[str]:
    """Each server's throughput and TTFT p50 over `reference`'s in the same round."""
    by = {(r["server"], r["concurrency"], r["round"]): r for r in rows}
    lines = []
    for server, concurrency in dict.fromkeys((r["server"], r["concurrency"]) for r in rows):
        pairs = [
            (r, by[(reference, concurrency, k)])
            for (name, c, k), r in by.items()
            if (name, c) == (server, concurrency) and (reference, c, k) in by
        ]
        if server == reference or not pairs:
            continue
        tok = [a["output_tok_s"] / b["output_tok_s"] for a, b in pairs]
        ttft = [a["ttft_p50_s"] / b["ttft_p50_s"] for a, b in pairs if b["ttft_p50_s"]]
        lines.append(
            f"{server} / {reference}, c={concurrency}: throughput "
            f"{' '.join(f'{x:.3f}' for x in tok)} (median {statistics.median(tok):.3f}); "
            f"TTFT p50 {' '.join(f'{x:.2f}' for x in ttft)}"
            + (f" (median {statistics.median(ttft):.2f})" if ttft else "")
        )
    return lines
