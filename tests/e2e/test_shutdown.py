"""SIGTERM on the real process: drain, finish or cut in-flight streams, exit."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.kvserve_process import Server, running

pytestmark = pytest.mark.model

NO_EMBEDDINGS = {"KVSERVE_ENGINE_EMBEDDINGS": "false"}


class Stream(threading.Thread):
    """A streaming chat request read to its end on a thread: its SSE payloads."""

    def __init__(self, url: str, max_tokens: int):
        super().__init__(daemon=True)
        self.url = url
        self.body = {
            "model": "SmolLM2-135M-Instruct",
            "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
        self.events: list[str] = []
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            with httpx.stream(
                "POST", f"{self.url}/v1/chat/completions", json=self.body, timeout=120
            ) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line[6:])
        except Exception as exc:  # reported by the test
            self.error = exc

    def wait_for_tokens(self, count: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while len(self.events) < count:
            assert self.error is None and time.monotonic() < deadline, self.error
            time.sleep(0.02)

    def chunks(self) -> list[dict]:
        return [json.loads(e) for e in self.events if e != "[DONE]"]


@contextlib.contextmanager
def streaming(tmp_path: Path, grace: int, max_tokens: int) -> Iterator[tuple[Server, Stream]]:
    """A server with two slots and `grace` seconds of shutdown grace, and a stream on it
    that has sent its first tokens."""
    args = ["--parallel", "2", "--shutdown-grace", str(grace)]
    with running(args, tmp_path, env=NO_EMBEDDINGS) as k:
        stream = Stream(k.url, max_tokens=max_tokens)
        stream.start()
        stream.wait_for_tokens(2)
        yield k, stream


def test_sigterm_lets_a_stream_finish_refuses_new_work_and_exits_0(tmp_path: Path) -> None:
    with streaming(tmp_path, 120, max_tokens=128) as (k, stream):
        # long enough to be still running when the checks below are made (about 2 s
        # on an idle machine), short enough to finish well within the grace
        k.process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        refused = httpx.get(f"{k.url}/v1/models", timeout=10)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "shutting_down"
        assert httpx.get(f"{k.url}/health", timeout=10).json()["status"] == "draining"
        stream.join(120)
        assert stream.error is None and stream.events[-1] == "[DONE]"
        chunks = stream.chunks()
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")) >= 12
        assert k.process.wait(60) == 0
        assert "shutting down" in k.log()


def test_grace_over_cuts_the_stream_with_a_proper_end(tmp_path: Path) -> None:
    with streaming(tmp_path, 1, max_tokens=3000) as (k, stream):
        started = time.monotonic()
        k.process.send_signal(signal.SIGTERM)
        stream.join(60)
        assert stream.error is None and stream.events[-1] == "[DONE]"
        assert len(stream.chunks()) < 1000
        assert k.process.wait(60) == 0
        assert time.monotonic() - started < 30
        assert "shutdown grace over: cancelling 1 request(s)" in k.log()


def test_second_sigterm_exits_at_once(tmp_path: Path) -> None:
    with streaming(tmp_path, 600, max_tokens=3000) as (k, stream):
        k.process.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert k.process.poll() is None  # draining: the stream may run for 600 s
        k.process.send_signal(signal.SIGTERM)
        assert k.process.wait(10) == 1
        assert "second SIGTERM: exiting now" in k.log()
