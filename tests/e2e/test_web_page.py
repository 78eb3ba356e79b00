"""The page at / in a real headless Chromium (Debian's chromium + chromium-driver, driven
by selenium): against the real kvserve process, a conversation streamed and warm on its
session, the key field, the live status view; against the fake engine behind real
uvicorn, a hostile reply and a hostile user message rendered inert, and the stop button.
No test ends with an error in the browser's console."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.shared import keyed_server
from tests.fakes import FakeEngine
from tests.helpers.browser import AVAILABLE, chromium, console_errors, wait_for
from tests.helpers.threaded_server import serving
from tests.kvserve_process import MODEL

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not AVAILABLE, reason="chromium and chromium-driver are not installed"),
]

KEY = "sk-page-test"


def by_css(driver: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)  # type: ignore[no-any-return]


def one(driver: Any, selector: str) -> Any:
    found = by_css(driver, selector)
    assert len(found) == 1, f"{selector}: {len(found)} elements"
    return found[0]


def send(driver: Any, text: str) -> Any:
    """Type `text`, press Send, wait for the reply to finish: its stats line."""
    before = len(by_css(driver, ".msg.assistant .stats"))
    one(driver, "#prompt").send_keys(text)
    one(driver, "#send").click()
    wait_for(lambda: len(by_css(driver, ".msg.assistant .stats")) > before, 120, "the reply")
    return by_css(driver, ".msg.assistant")[-1]


def count_paints(driver: Any) -> None:
    """Count the DOM updates of the reply being streamed (window.__paints)."""
    driver.execute_script(
        "window.__paints = 0;"
        "new MutationObserver(() => window.__paints++)"
        ".observe(document.getElementById('messages'), {childList: true, subtree: true});"
    )


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


# -- the real server ------------------------------------------------------------------


server = keyed_server(KEY)


def open_page(browser: Any, server: str, path: str = "/") -> None:
    """The page with the key already stored, as after the user typed it once."""
    browser.get(f"{server}/static/style.css")  # same origin: the key, before the page asks
    browser.execute_script("window.localStorage.setItem('kvserve.apiKey', arguments[0])", KEY)
    console_errors(browser)  # drained (the CSS file's favicon.ico 404 is left out there)
    browser.get(f"{server}{path}")


@pytest.mark.model
def test_chat_streams_and_the_second_turn_is_warm(browser: Any, server: str) -> None:
    open_page(browser, server)
    wait_for(lambda: by_css(browser, f"#model option[value='{MODEL}']"), 30, "the model list")
    assert one(browser, "#key-bar").is_displayed()  # a stored key shows the field
    session = one(browser, "#session-note").text.removeprefix("session ")
    limit = one(browser, "#max-tokens")  # short replies: this machine may be busy
    limit.clear()
    limit.send_keys("12")
    assert session.startswith("web-")

    count_paints(browser)
    first = send(browser, "Name three colors.")
    reply = first.find_element("css selector", ".body").text
    assert reply.strip()
    assert browser.execute_script("return window.__paints") > 3  # streamed, not at once
    stats = first.find_element("css selector", ".stats")
    assert float(stats.get_attribute("data-ttft")) > 0
    assert int(stats.get_attribute("data-prompt-tokens")) > 0
    # the page's limit reached the server (the reply is sampled: it may end sooner)
    generated = re.search(r"(\d+) tokens", stats.text)
    assert generated and 0 < int(generated.group(1)) <= 12, stats.text
    assert "tok/s" in stats.text or generated.group(1) == "1", stats.text

    second = send(browser, "Three more, please.")
    stats = second.find_element("css selector", ".stats")
    cached = int(stats.get_attribute("data-cached"))
    assert cached > 0, stats.text  # the session's slot held the first turn
    assert cached < int(stats.get_attribute("data-prompt-tokens"))

    # The server's view of it, through the API the page uses.
    sessions = httpx.get(f"{server}/v1/sessions", headers={"Authorization": f"Bearer {KEY}"})
    assert session in [s["id"] for s in sessions.json()["data"]]
    assert console_errors(browser) == []


@pytest.mark.model
def test_status_view_is_live(browser: Any, server: str) -> None:
    open_page(browser, server, "/#server")
    card = f".model-card[data-model='{MODEL}']"
    wait_for(lambda: by_css(browser, card), 30, "the model's card")
    assert not one(browser, "#status-error").is_displayed()
    assert one(browser, f"{card} .badge").get_attribute("data-state") == "loaded"
    assert len(by_css(browser, f"{card} .slot")) == 2
    assert by_css(browser, f"{card} .chart.throughput svg polyline")
    assert by_css(browser, f"{card} .tiers")
    family = one(browser, f"{card} p.family")  # the load's probe (issue 27)
    assert family.get_attribute("data-memory") == "attention"
    assert family.text.startswith("llama · attention memory") and "Q4_1" in family.text
    before = int(one(browser, f"{card} .requests-total").get_attribute("data-count"))
    sessions_before = {e.text for e in by_css(browser, f"{card} table.sessions td:first-child")}

    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
            "session_id": "from-a-script"}  # fmt: skip
    r = httpx.post(f"{server}/v1/chat/completions", json=body,
                   headers={"Authorization": f"Bearer {KEY}"}, timeout=300)  # fmt: skip
    assert r.status_code == 200

    def changed() -> bool:
        count = int(one(browser, f"{card} .requests-total").get_attribute("data-count"))
        ids = {e.text for e in by_css(browser, f"{card} table.sessions td:first-child")}
        return count > before and "from-a-script" in ids - sessions_before

    wait_for(changed, 30, "the status view to show the new request and session")
    assert console_errors(browser) == []


@pytest.mark.model
def test_the_key_field_when_the_server_has_keys(browser: Any, server: str) -> None:
    browser.get(f"{server}/")
    browser.execute_script("window.localStorage.clear()")
    browser.get(f"{server}/")
    wait_for(lambda: one(browser, "#key-bar").is_displayed(), 15, "the key field")
    assert "models:" in one(browser, "#chat-error").text
    one(browser, "#api-key").send_keys(KEY)
    one(browser, "#save-key").click()
    wait_for(lambda: by_css(browser, f"#model option[value='{MODEL}']"), 15, "the model list")
    assert browser.execute_script("return window.localStorage.getItem('kvserve.apiKey')") == KEY
    errors = console_errors(browser)
    assert errors and all("401" in e for e in errors), errors  # only the refused, keyless call


# -- the fake engine behind real uvicorn ------------------------------------------------

HOSTILE = (
    "Here: <img src=x onerror=\"window.__xss=1\"> <script>window.__xss=2</script>\n\n"
    "[click me](javascript:window.__xss=3) **bold** `<b>code</b>`\n\n"
    "```html\n<svg onload=\"window.__xss=4\"></svg>\n```\n"
)


@pytest.fixture(scope="module")
def fake_server() -> Iterator[tuple[str, FakeEngine]]:
    engine = FakeEngine(reply=HOSTILE, n_ctx=4096)  # the page asks for max_tokens 512
    with serving(engine) as url:
        yield url, engine


def test_a_hostile_reply_and_message_render_inert(
    browser: Any, fake_server: tuple[str, FakeEngine]
) -> None:
    url, _ = fake_server
    browser.get(f"{url}/")
    wait_for(lambda: by_css(browser, "#model option[value='fake-model']"), 15, "the model list")
    assert not one(browser, "#key-bar").is_displayed()  # this server has no keys
    reply = send(browser, "<img src=y onerror=\"window.__xss=5\"><b>typed</b>")

    user = by_css(browser, ".msg.user")[-1]
    assert user.find_elements("css selector", "img, b") == []
    assert "<img src=y" in user.text
    body = reply.find_element("css selector", ".body")
    # Markup in the reply stayed text: no element was made from it.
    assert body.find_elements("css selector", "img, script, svg, b") == []
    assert "<img src=x onerror=" in body.text and "<script>" in body.text
    assert "<svg onload=" in body.find_element("css selector", "pre code").text
    assert body.find_element("css selector", "code").text == "<b>code</b>"
    # ...while the markdown around it was rendered, and the javascript: link was not.
    assert body.find_element("css selector", "strong").text == "bold"
    assert body.find_elements("css selector", "a") == []
    assert browser.execute_script("return window.__xss === undefined")
    assert console_errors(browser) == []


def test_the_model_list_says_what_a_model_takes(
    browser: Any, fake_server: tuple[str, FakeEngine]
) -> None:
    url, _ = fake_server  # a text model
    browser.get(f"{url}/")
    found = wait_for(lambda: by_css(browser, "#model option[value='fake-model']"), 15, "models")
    assert found[0].get_attribute("data-modalities") == "text"
    assert found[0].text == "fake-model"
    assert one(browser, "#model-takes").text == "takes text"
    # a model with a projector loaded: /v1/models meta.modalities.vision
    with serving(FakeEngine(model_id="vlm", vision=True)) as vision_url:
        browser.get(f"{vision_url}/")
        found = wait_for(lambda: by_css(browser, "#model option[value='vlm']"), 15, "models")
        assert found[0].get_attribute("data-modalities") == "text, images"
        assert found[0].text == "vlm · images"
        assert one(browser, "#model-takes").text == "takes text and images"
        assert console_errors(browser) == []


BLOCKS = (
    "# Title\n"
    "one\ntwo\n\n"
    "- a\n  more of a\n- b\n"
    "1. c\n"
    "> q1\n> q2\n\n"
    "```py\nx = 1\n```\n"
    "after"
)
BLOCKS_HTML = (
    "<h3>Title</h3><p>one<br>two</p><ul><li>a more of a</li><li>b</li></ul><ol><li>c</li></ol>"
    '<blockquote>q1<br>q2</blockquote><pre><code data-lang="py">x = 1</code></pre><p>after</p>'
)


def test_every_block_kind_renders(browser: Any, fake_server: tuple[str, FakeEngine]) -> None:
    url, _ = fake_server
    browser.get(f"{url}/")
    html = browser.execute_async_script(
        "const [text, done] = arguments;"
        "import('/static/markdown.js').then((m) => {"
        "  const div = document.createElement('div'); m.renderMarkdown(div, text);"
        "  done(div.innerHTML); });",
        BLOCKS,
    )
    assert html == BLOCKS_HTML


def test_stop_ends_a_reply_and_the_next_turn_works(
    browser: Any, fake_server: tuple[str, FakeEngine]
) -> None:
    url, engine = fake_server
    engine.reply, engine.delay = ("word " * 400).encode(), 0.02  # about 8 s unless stopped
    try:
        browser.get(f"{url}/")
        wait_for(lambda: by_css(browser, "#model option[value='fake-model']"), 15, "models")
        one(browser, "#prompt").send_keys("go on")
        one(browser, "#send").click()
        wait_for(lambda: "word" in by_css(browser, ".msg.assistant .body")[-1].text, 10, "words")
        one(browser, "#stop").click()
        stats = wait_for(lambda: by_css(browser, ".msg.assistant .stats"), 5, "the stop")[-1]
        assert "stopped" in stats.text
        assert len(by_css(browser, ".msg.assistant .body")[-1].text) < len("word " * 400) - 5
        assert one(browser, "#send").is_enabled() and not one(browser, "#stop").is_enabled()
        wait_for(lambda: not engine.running, 5, "the server to abort the sequence")

        engine.reply, engine.delay = b"done", 0.0
        reply = send(browser, "again")
        assert reply.find_element("css selector", ".body").text == "done"
        assert console_errors(browser) == []
    finally:
        engine.reply, engine.delay = HOSTILE.encode(), 0.0
