"""One real kvserve process shared by the reliability tests: 4 slots, a queue of 8, a
small context (256 tokens per sequence, so any generation is short and any prompt of
a few hundred tokens is already too long). Every test leaves it serving; `healthy`
checks that after each one."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.kvserve_process import MODEL, Server, metrics, running

SLOTS = 4
QUEUE = 8
N_CTX = 256
SERVER_ARGS = [
    "--parallel", str(SLOTS),
    "--max-queue", str(QUEUE),
    "--n-ctx", str(N_CTX),
    "--log-level", "warning",
    # One llama.cpp thread: on a busy 2-core machine, two threads that meet at a barrier
    # every op wait for each other's time slice (measured 3-5x slower per request).
    "--threads", "1",
]  # fmt: skip


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running(SERVER_ARGS, tmp_path_factory.mktemp("reliability")) as proc:
        yield proc
        # nothing in the whole suite may have crashed a handler or the engine thread
        log = proc.log()
        assert "Traceback" not in log, log[-4000:]


def assert_serves(server: Server) -> None:
    """The server is up, its engine idle, and a normal request is answered normally."""
    assert server.process.poll() is None, server.log()[-4000:]
    assert httpx.get(f"{server.url}/health", timeout=10).json()["status"] == "ok"
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hi."}],
        "max_tokens": 4,
        "temperature": 0,
    }
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")
    values = metrics(server.url)
    assert values["kvserve_decode_failures_total"] == 0


def idle(server: Server) -> bool:
    values = metrics(server.url)
    return values["kvserve_slots_in_use"] == 0 and values["kvserve_queue_depth"] == 0


@pytest.fixture
def healthy(server: Server) -> Iterator[Server]:
    """The shared server; after the test it must still serve and be idle."""
    yield server
    assert_serves(server)
