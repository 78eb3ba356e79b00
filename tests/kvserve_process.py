"""Start a real `kvserve` process on a free loopback port and wait until it serves.

Shared by the end-to-end and reliability tests: the server runs as it does in
production (`python -m server`, one uvicorn worker, the real engine), and is always
stopped, killed if need be, when the block exits.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

MODEL = "SmolLM2-135M-Instruct"
# A server process's environment: Python hides ResourceWarning by default; shown, a leaked
# socket, file, event loop or transport is written to the server's log. Except one:
# llama-cpp-python opens two /dev/null files at import (llama_cpp/_utils.py, its
# stdout/stderr suppressor) and keeps them for the life of the process, which Python
# reports as unclosed when a process that failed its start exits.
SHOW_LEAKS = {
    "PYTHONWARNINGS": "default::ResourceWarning,"
    "ignore:unclosed file <_io.TextIOWrapper name='/dev/null':ResourceWarning"
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def rss_bytes(self) -> int:
        """Resident memory of the server process (Linux /proc)."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")


def wait_ready(server: Server, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert server.process.poll() is None, f"kvserve exited:\n{server.log()}"
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{server.url}/health", timeout=1).status_code == 200:
                return
        assert time.monotonic() < deadline, f"kvserve did not become ready:\n{server.log()}"
        time.sleep(0.1)


def stop(server: Server) -> None:
    terminate(server.process, 30)


def terminate(process: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM, then SIGKILL past `grace_s`; nothing if the process has already ended."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def running(
    args: list[str], log_dir: Path, *, wait: bool = True, env: dict[str, str] | None = None
) -> Iterator[Server]:
    """`kvserve <args>` on a free port; logs go to log_dir/kvserve-<port>.log. The disk
    tier is on by default: unless `env` sets XDG_CACHE_HOME, each server gets its own
    empty cache directory, log_dir/xdg-<port> (never the real home, never another
    test's entries).

    The server reports what it leaks (SHOW_LEAKS): a block that ends normally fails if
    the log has a leaked socket, file, event loop or transport in it."""
    port = free_port()
    log_path = log_dir / f"kvserve-{port}.log"
    env = {
        "XDG_CACHE_HOME": str(log_dir / f"xdg-{port}"),
        **SHOW_LEAKS,
        **(env or {}),
    }
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "server", "--port", str(port), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
        )
        server = Server(f"http://127.0.0.1:{port}", process, log_path)
        try:
            if wait:
                wait_ready(server)
            yield server
        finally:
            stop(server)
    assert_no_leaks(server)


def assert_no_leaks(server: Server) -> None:
    """No ResourceWarning in the stopped server's log (see `running`)."""
    log = server.log()
    assert "ResourceWarning" not in log, log[max(0, log.index("ResourceWarning") - 2000) :][:6000]


def metrics(url: str) -> dict[str, float]:
    """Every sample of /metrics labelled by nothing but the model (these servers serve
    one), parsed by prometheus_client's parser. Counters appear under their `_total`
    sample name."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=10).text
    # A labelled counter has no sample until it first counts: read as 0.
    out: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if set(sample.labels) <= {"model"}:
                out[sample.name] = sample.value
    return out
