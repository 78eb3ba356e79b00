"""The process keeps its resources (issue 9, items 7 and 8), against real server
processes of their own: an unusable disk_dir stops the start with status 2, and
connections that send nothing are bounded and timed out, under a descriptor limit set
with prlimit, without flooding the log."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.kvserve_process import SHOW_LEAKS, free_port, running, terminate

pytestmark = pytest.mark.model

ARGS = ["--parallel", "1", "--n-ctx", "256", "--threads", "1", "--log-level", "warning"]


def test_an_unusable_disk_dir_stops_the_start_with_status_2(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    env = {"KVSERVE_CACHE_DISK_DIR": str(blocker / "cache")}
    with running(ARGS, tmp_path, wait=False, env=env) as server:
        assert server.process.wait(60) == 2
        assert "cache.disk_dir is not usable" in server.log()


def test_silent_connections_are_bounded_and_timed_out_under_a_descriptor_limit(
    tmp_path: Path,
) -> None:
    port = free_port()
    log_path = tmp_path / "kvserve.log"
    limit = 256  # descriptors for the whole server process
    env = {**os.environ, **SHOW_LEAKS, "PYTHONUNBUFFERED": "1", "KVSERVE_SERVER_HEADER_TIMEOUT_S": "2"}
    command = ["prlimit", f"--nofile={limit}:{limit}", sys.executable, "-m", "server"]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [*command, "--port", str(port), *ARGS], stdout=log, stderr=subprocess.STDOUT, env=env
        )
    url = f"http://127.0.0.1:{port}"
    silent: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, log_path.read_text()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
        # More silent connections than the server has descriptors.
        for _ in range(limit + 150):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            silent.append(s)
        # Within the head timeout (and some slack for a busy machine) every one of them
        # is closed by the server: a read sees the end of the stream.
        time.sleep(4)
        closed = 0
        for s in silent:
            s.settimeout(10)
            try:
                closed += s.recv(1) == b""
            except ConnectionResetError:  # reset by the server: closed too
                closed += 1
        assert closed == len(silent)
        # The server answers again, and said little about it.
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        text = log_path.read_text(errors="replace")
        assert text.count("Too many open files") <= 5, text[-3000:]
        assert len(text) < 20_000, text[-3000:]
        assert "ResourceWarning" not in text, text[-3000:]  # no connection leaked
    finally:
        for s in silent:
            s.close()
        terminate(process, 30)
