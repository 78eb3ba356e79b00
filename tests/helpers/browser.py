"""Headless Chromium driven by selenium, for the page's tests and its screenshots.

Debian's `chromium` and `chromium-driver` packages (.ci/run installs them); selenium is
pointed at both binaries, so its manager never downloads a browser or a driver.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
AVAILABLE = CHROMIUM is not None and CHROMEDRIVER is not None

T = TypeVar("T")


@contextlib.contextmanager
def chromium(width: int = 1200, height: int = 900) -> Iterator[Any]:
    """A headless Chromium that keeps the page's console messages (`console_errors`)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    assert CHROMIUM and CHROMEDRIVER, "install Debian's chromium and chromium-driver"
    options = Options()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",  # nothing leaves the loopback
        "--disable-component-update",
        f"--window-size={width},{height}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver: Any) -> list[str]:
    """The SEVERE console entries since the last call (the log is drained by reading),
    but for /favicon.ico's 404: the page names its icon (`data:,`) and asks for none, but
    a bare file the tests open first (the style sheet, to store a key on the origin) has
    no icon link, and Chromium's request for one may be logged after a drain, into the
    next page's entries."""
    return [
        e["message"] for e in driver.get_log("browser")
        if e["level"] == "SEVERE" and "/favicon.ico " not in e["message"]
    ]  # fmt: skip


def wait_for(condition: Callable[[], T | None], timeout: float = 60.0, what: str = "") -> T:
    """Poll `condition` until it returns something truthy; fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):  # an element replaced mid-read: ask again
            value = condition()
            if value:
                return value
        assert time.monotonic() < deadline, f"timed out waiting for {what or condition}"
        time.sleep(0.1)
