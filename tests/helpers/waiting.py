"""Waiting, in tests, for a condition another task makes true."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(check: Callable[[], object], seconds: float = 5.0) -> None:
    """Return once `check()` is true, polling every 10 ms; fail after `seconds`."""
    for _ in range(int(seconds / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out waiting")
