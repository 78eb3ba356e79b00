"""Log lines cannot be forged by what clients send (issue 28, item 14): the path, the
session header and any other request text reach the log with their control characters
escaped; text lines stay one line each, JSON lines stay valid JSON."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Callable, Iterator

import pytest

from server.config.tree import LoggingSection
from server.telemetry.access import _logfmt
from server.telemetry.logs import escape_controls, setup_logging
from tests.conftest import ClientFactory
from tests.fakes import FakeEngine

FORGED = "/x%0a2030-01-01 INFO kvserve.access: request_id=forged status=200"


@pytest.fixture
def logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[bool], io.StringIO]]:
    """kvserve's own logging set-up (text or JSON) writing to a buffer; the root
    logger's handlers and levels as they were afterwards."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    levels = {n: logging.getLogger(n).level for n in ("kvserve.access", "kvserve.llama")}

    def start(as_json: bool) -> io.StringIO:
        buffer = io.StringIO()
        monkeypatch.setattr(sys, "stderr", buffer)
        setup_logging(LoggingSection(json=as_json))
        return buffer

    yield start
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in saved[0]:
        root.addHandler(handler)
    root.setLevel(saved[1])
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def _access_lines(buffer: io.StringIO) -> list[str]:
    """The lines of the access logger (date, time, level, then the logger's name)."""
    lines = buffer.getvalue().splitlines()
    return [line for line in lines if line.split(" ")[3:4] == ["kvserve.access:"]]


async def test_a_newline_in_the_path_writes_one_escaped_line(
    logs: Callable[[bool], io.StringIO], make_client: ClientFactory
) -> None:
    buffer = logs(False)
    client = make_client(FakeEngine())
    assert (await client.get(FORGED)).status_code == 404
    lines = buffer.getvalue().splitlines()
    assert not any(line.startswith("2030-01-01") for line in lines), lines
    (text,) = _access_lines(buffer)
    assert "request_id=forged" in text  # still there, inside the quoted path only
    assert 'path="/x\\n2030-01-01 INFO kvserve.access: request_id=forged status=200"' in text
    assert text.count(" status=") == 2 and " status=404 " in text  # the real one, unquoted


async def test_a_json_line_stays_json_and_keeps_the_value(
    logs: Callable[[bool], io.StringIO], make_client: ClientFactory
) -> None:
    buffer = logs(True)
    client = make_client(FakeEngine())
    hostile = "/y\u2028z\u0085w\x7f"  # line breaks for some readers, DEL
    assert (await client.get(FORGED)).status_code == 404
    assert (await client.get("/y%E2%80%A8z%C2%85w%7F")).status_code == 404
    raw = buffer.getvalue()
    assert not any(c in raw for c in "\u2028\u0085\x7f")  # written as \u escapes
    lines = [json.loads(line) for line in raw.split("\n")[:-1]]  # each one valid JSON
    first, second = (line for line in lines if line["logger"] == "kvserve.access")
    assert first["path"] == "/x\n2030-01-01 INFO kvserve.access: request_id=forged status=200"
    assert first["request_id"] != "forged" and first["status"] == 404
    assert second["path"] == hostile


async def test_the_session_header_is_escaped_too(
    logs: Callable[[bool], io.StringIO], make_client: ClientFactory
) -> None:
    buffer = logs(False)
    client = make_client(FakeEngine())
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
    r = await client.post("/v1/chat/completions", json=body,
                          headers={"X-Kvserve-Session": "s\x1b[2J1 status=500"})  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["param"] == "X-Kvserve-Session"
    (line,) = _access_lines(buffer)
    assert "\x1b" not in line and 'session="s\\x1b[2J1 status=500"' in line


def test_every_logger_writes_one_line_per_message(logs: Callable[[bool], io.StringIO]) -> None:
    buffer = logs(False)
    log = logging.getLogger("kvserve.server")
    log.warning("model %s not found", "m\r\n2030-01-01 ERROR forged")
    try:
        raise ValueError("bad value\n2030-01-01 INFO kvserve.access: forged")
    except ValueError:
        log.exception("unhandled error on %s", "/p\x9b31m")
    lines = buffer.getvalue().splitlines()
    assert lines[0].endswith("model m\\r\\n2030-01-01 ERROR forged not found")
    assert lines[1].endswith("unhandled error on /p\\x9b31m")
    traceback = lines[2:]
    assert traceback[0] == "  Traceback (most recent call last):"
    assert all(line.startswith("  ") for line in traceback)  # none passes for a log line
    assert traceback[-1] == "  2030-01-01 INFO kvserve.access: forged"


@pytest.mark.parametrize(
    "value,shown",
    [
        ("/v1/chat/completions", "/v1/chat/completions"),
        (200, "200"),
        ("a b", '"a b"'),
        ("/x status=200", '"/x status=200"'),
        ('q"uote', '"q\\"uote"'),
        ("back\\slash", '"back\\\\slash"'),
        ("tab\there", '"tab\\there"'),
        ("", '""'),
        ("naïve", "naïve"),
    ],
)
def test_access_values_are_quoted_when_they_could_be_read_as_more(value: object, shown: str) -> None:
    assert _logfmt(value) == shown


def test_escape_controls_covers_c0_del_c1_and_unicode_breaks() -> None:
    assert escape_controls("a\x00b\x1fc\x7fd\x80e\x9ff\u2028g\u2029h\u202ei\u2066") == (
        "a\\x00b\\x1fc\\x7fd\\x80e\\x9ff\\u2028g\\u2029h\\u202ei\\u2066"
    )
    assert escape_controls("plain text, é, 漢字") == "plain text, é, 漢字"

