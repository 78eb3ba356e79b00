"""kvserve's app on a fake engine under real uvicorn, in a thread, on a free loopback port."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

from server.app import create_app
from server.config.tree import Settings
from tests.fakes import FakeEngine


@contextlib.contextmanager
def serving(engine: FakeEngine, settings: Settings | None = None) -> Iterator[str]:
    """The server's URL while it runs; stopped (and its thread joined) on leaving."""
    with serving_app(create_app(settings or Settings(), engine=engine)) as url:
        yield url


@contextlib.contextmanager
def serving_app(app: Any) -> Iterator[str]:
    """Any ASGI app under uvicorn in a thread (the URL while it runs), as `serving`."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
