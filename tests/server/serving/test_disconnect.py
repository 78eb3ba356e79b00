"""A client that goes away aborts its sequences (real uvicorn, fake engine)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tests.fakes import FakeEngine
from tests.helpers.threaded_server import serving


@pytest.fixture
def served() -> Iterator[tuple[str, FakeEngine]]:
    engine = FakeEngine(reply="word " * 200, delay=0.02)
    with serving(engine) as url:
        yield url, engine


def wait_for(condition: object, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "go"}]}


def test_dropped_stream_aborts_the_sequence(served: tuple[str, FakeEngine]) -> None:
    url, engine = served
    with (
        httpx.Client(base_url=url) as client,
        client.stream("POST", "/v1/chat/completions", json={**BODY, "stream": True}) as r,
    ):
        assert r.status_code == 200
        lines = r.iter_lines()
        received = [next(lines) for _ in range(6)]
        assert any(line.startswith("data: ") for line in received)
    # leaving the block closed the connection mid-stream
    assert wait_for(lambda: len(engine.aborted) == 1)
    assert wait_for(lambda: not engine.running)


def test_dropped_non_streaming_request_aborts_the_sequence(served: tuple[str, FakeEngine]) -> None:
    url, engine = served
    with httpx.Client(base_url=url, timeout=0.3) as client, pytest.raises(httpx.ReadTimeout):
        client.post("/v1/chat/completions", json=BODY)
    assert wait_for(lambda: len(engine.aborted) == 1)
    assert wait_for(lambda: not engine.running)


def test_completed_request_is_not_aborted(served: tuple[str, FakeEngine]) -> None:
    url, engine = served
    engine.reply = b"short"
    with httpx.Client(base_url=url) as client:
        r = client.post("/v1/chat/completions", json=BODY)
    assert r.json()["choices"][0]["message"]["content"] == "short"
    assert engine.aborted == []
