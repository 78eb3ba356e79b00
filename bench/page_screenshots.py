"""Screenshots of the page at / for the README: a real kvserve on the default model, a
short conversation (two turns on one session, the second warm), then the server view.

    python -m bench.page_screenshots [--out bench/charts]

Uses the page tests' headless Chromium (tests/helpers/browser.py: Debian's chromium and
chromium-driver)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.helpers.browser import chromium, wait_for  # noqa: E402
from tests.kvserve_process import MODEL, running  # noqa: E402

TURNS = (
    "Write a Python function that adds two numbers, in a code block.",
    "Now explain it briefly.",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("bench/charts"))
    parser.add_argument("--max-tokens", type=int, default=80)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory() as tmp,
        running(["--parallel", "2"], Path(tmp)) as server,
        chromium(1200, 1000) as driver,
    ):
        find = driver.find_elements
        driver.get(f"{server.url}/")
        wait_for(lambda: find("css selector", f"#model option[value='{MODEL}']"), 30)
        limit = driver.find_element("css selector", "#max-tokens")
        limit.clear()
        limit.send_keys(str(args.max_tokens))
        system = driver.find_element("css selector", "#system-box summary")
        system.click()
        driver.find_element("css selector", "#system").send_keys("You are a concise assistant.")
        for n, text in enumerate(TURNS, 1):
            driver.find_element("css selector", "#prompt").send_keys(text)
            driver.find_element("css selector", "#send").click()
            wait_for(lambda n=n: len(find("css selector", ".msg .stats")) >= n, 900)
        driver.save_screenshot(str(args.out / "page-chat.png"))
        driver.find_element("css selector", "#tab-status").click()
        wait_for(lambda: find("css selector", ".model-card"), 30)
        time.sleep(2)  # one more poll: the charts have the last samples
        driver.save_screenshot(str(args.out / "page-status.png"))
    print(f"wrote {args.out / 'page-chat.png'} and {args.out / 'page-status.png'}")


if __name__ == "__main__":
    main()
