"""bench/compare.py's interleaved rounds and bench/paired.py's ratios (no model, no server)."""

from __future__ import annotations

import argparse
import signal
from typing import Any

import pytest

from bench import compare, paired


class FakeProc:
    def __init__(self, name: str, log: list[tuple[str, str]]):
        self.name, self.log = name, log

    def send_signal(self, sig: int) -> None:
        self.log.append(
            (self.name, {int(signal.SIGSTOP): "stop", int(signal.SIGCONT): "cont"}[sig])
        )

    def terminate(self) -> None:
        self.log.append((self.name, "terminate"))

    def wait(self, timeout: float) -> None:
        pass


def test_interleaved_rounds_rotate_and_only_the_server_under_load_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log: list[tuple[str, str]] = []
    running: set[str] = set()

    def start(name: str, threads: int, parallel: int) -> tuple[FakeProc, str, str]:
        running.add(name)
        return FakeProc(name, log), f"http://{name}", "m"

    def load(label: str, url: str, model: str, concurrency: int, args: Any) -> dict:
        latest = {n: what for n, what in log}  # each server's latest signal
        assert latest[label] == "cont"
        assert all(latest[n] == "stop" for n in running if n != label), log
        log.append((label, f"load c={concurrency}"))
        return {"server": label, "concurrency": concurrency, "output_tok_s": 1.0}

    monkeypatch.setattr(compare, "start", start)
    monkeypatch.setattr(compare, "load", load)
    monkeypatch.setattr(compare, "warm_up", lambda *a: None)
    args = argparse.Namespace(threads=2, parallel=8, rounds=3, concurrency=[1, 8])
    rows = compare.interleaved(["a", "b", "c"], args)
    loads = [(n, what) for n, what in log if what.startswith("load")]
    assert [n for n, _ in loads] == [
        *"abc", *"abc",  # round 0, c=1 then c=8
        *"bca", *"bca",  # round 1: the order rotates
        *"cab", *"cab",
    ]  # fmt: skip
    assert [(r["server"], r["round"]) for r in rows][:4] == [("a", 0), ("b", 0), ("c", 0), ("a", 0)]
    assert [what for _, what in log[-6:]] == ["cont", "terminate"] * 3


def test_paired_ratios_divide_within_a_round() -> None:
    def row(server: str, c: int, k: int, tok: float, ttft: float) -> dict:
        return {"server": server, "concurrency": c, "round": k, "output_tok_s": tok,
                "ttft_p50_s": ttft}  # fmt: skip

    rows = [
        row("kvserve", 1, 0, 110.0, 0.1), row("llama-server", 1, 0, 100.0, 0.2),
        row("kvserve", 1, 1, 45.0, 0.3), row("llama-server", 1, 1, 50.0, 0.3),
        row("kvserve", 1, 2, 99.0, 0.1), row("llama-server", 1, 2, 100.0, 0.1),
    ]  # fmt: skip
    (line,) = paired.paired_ratios(rows, "llama-server")
    assert line == (
        "kvserve / llama-server, c=1: throughput 1.100 0.900 0.990 (median 0.990); "
        "TTFT p50 0.50 1.00 1.00 (median 1.00)"
    )


def test_the_reference_is_llama_server_where_named_else_the_last() -> None:
    assert paired.reference_of(["llama-server", "kvserve@/tmp/base", "kvserve"]) == "llama-server"
    assert paired.reference_of(["kvserve", "llama-server-nofa"]) == "llama-server-nofa"
    assert paired.reference_of(["kvserve@/tmp/base", "kvserve"]) == "kvserve"
