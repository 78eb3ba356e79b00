"""Start Debian's `redis-server` on a free loopback port (the shared cache tier's store).

The tests run the real server, never the system service: no persistence, a memory
limit with LRU eviction (how a deployment should run it), everything under a temporary
directory. stop()/start() keep the port, so a test can take the store away and bring
it back.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kvserve_process import free_port, terminate

REDIS_SERVER = shutil.which("redis-server") or (
    "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
)


class Redis:
    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.workdir = workdir
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert REDIS_SERVER is not None
        log = open(self.workdir / f"redis-{self.port}.log", "ab")  # noqa: SIM115
        self.process = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.workdir),
                "--maxmemory", "512mb",
                "--maxmemory-policy", "allkeys-lru",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + 20
        while True:
            assert self.process.poll() is None, "redis-server exited"
            with contextlib.suppress(OSError), socket.create_connection(
                ("127.0.0.1", self.port), timeout=0.5
            ) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return
            assert time.monotonic() < deadline, "redis-server did not come up"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None:
            terminate(self.process, 10)


@contextlib.contextmanager
def running_redis(workdir: Path) -> Iterator[Redis]:
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server; .ci/run does it)")
    redis = Redis(workdir)
    redis.start()
    try:
        yield redis
    finally:
        redis.stop()
