"""Start the real `kvserve` process for a test, and always stop it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Kvserve:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, log_path: Path):
        self.proc = proc
        self.url = url
        self.log_path = log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)


@contextmanager
def kvserve(
    tmp: Path, *args: str, env: dict[str, str] | None = None, ready_timeout: float = 120
) -> Iterator[Kvserve]:
    """`python -m server --port <free> *args`, ready (/health 200) when yielded."""
    port = free_port()
    log_path = tmp / f"kvserve-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "server", "--port", str(port), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
    server = Kvserve(proc, f"http://127.0.0.1:{port}", log_path)
    try:
        deadline = time.monotonic() + ready_timeout
        while True:
            assert proc.poll() is None, server.log()
            try:
                if httpx.get(f"{server.url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "kvserve did not become ready"
            time.sleep(0.1)
        yield server
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
