"""Real MCP servers for the tests (tests/helpers/mcp/tool_server.py on the official SDK): one on
streamable HTTP (or SSE) on a free loopback port, stopped when the block exits; and the
command line of a stdio one."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.kvserve_process import free_port, terminate

SCRIPT = str(Path(__file__).with_name("tool_server.py"))


@dataclass
class HttpMcp:
    url: str
    log: Path  # the `slow` tool's start / cancelled / done lines
    process: subprocess.Popen[bytes]

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


def stdio_command(log: Path) -> tuple[str, tuple[str, ...]]:
    return sys.executable, (SCRIPT, "stdio", str(log))


def _wait_port(port: int, process: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError("the MCP test server exited at start")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.1)
    raise RuntimeError("the MCP test server did not start")


@contextlib.contextmanager
def http_mcp(tmp: Path, transport: str = "http", port: int | None = None) -> Iterator[HttpMcp]:
    """transport "http" (streamable HTTP, /mcp) or "sse" (/sse); on `port` (else a free one)."""
    port = port or free_port()
    log = tmp / f"mcp-{port}.log"
    process = subprocess.Popen(
        [sys.executable, SCRIPT, transport, str(port), str(log)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ},
    )  # fmt: skip
    try:
        _wait_port(port, process)
        path = "/sse" if transport == "sse" else "/mcp"
        yield HttpMcp(f"http://127.0.0.1:{port}{path}", log, process)
    finally:
        terminate(process, 10)
