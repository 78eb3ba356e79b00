"""What the model commands (server/cli/manage.py, server/cli/chat.py) share: the HTTP
client of the server they talk to, and its errors as one line for the terminal."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx


class CommandError(Exception):
    """What went wrong, as one line for the terminal."""


@contextmanager
def connect(host: str, api_key: str | None) -> Iterator[httpx.Client]:
    """A client of the server at `host` (a URL, or host:port)."""
    url = host if "://" in host else f"http://{host}"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = httpx.Timeout(10, read=None)  # an answer or a download may take long
    with httpx.Client(base_url=url, headers=headers, timeout=timeout) as client:
        yield client


def check(r: httpx.Response) -> Any:
    """The JSON of a successful answer; CommandError with the server's message else."""
    if r.is_success:
        return r.json()
    r.read()
    try:
        error = r.json().get("error")
    except ValueError:
        error = None
    if isinstance(error, dict):  # the OpenAI routes' shape
        error = error.get("message")
    raise CommandError(error or f"HTTP {r.status_code}")
