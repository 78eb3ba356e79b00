"""What the model commands (server/cli/manage.py, server/cli/chat.py) print of a server's
text, against the app on the fake engine: model names and error messages never as Rich
markup, model output without the terminal's control and escape sequences."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from server.app import create_app
from server.cli import manage
from server.cli.text import StreamFilter, printable
from server.config.tree import Settings
from tests.fakes import FakeEngine

HOSTILE = "x[/]y[bold]\x1b[2J\x1b]0;owned\x07"
ESCAPES = ("\x1b", "\x07", "\x9b", "\r", "\x08")


def kvserve(argv: list[str], engine: FakeEngine, monkeypatch: pytest.MonkeyPatch) -> int:
    """`kvserve ARGV` against the app on `engine` (in place of a server on --host)."""
    app = create_app(Settings(), engine=engine)

    @contextlib.contextmanager
    def connect(host: str, api_key: str | None) -> Iterator[Any]:
        with TestClient(app) as client:
            yield client

    monkeypatch.setattr(manage, "connect", connect)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
    return manage.main(argv)


def test_an_error_naming_a_model_with_markup_is_printed_as_text(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the server's 404 repeats the name: Rich read it as markup and raised MarkupError
    code = kvserve(["run", "bad[/]name", "hi"], FakeEngine(), monkeypatch)
    out = capsys.readouterr().out
    assert code == 1
    assert 'Error: model "bad[/]name" not found' in out, out


def test_ls_and_ps_show_hostile_model_names_as_plain_text(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in ("ls", "ps"):
        assert kvserve([command], FakeEngine(model_id=HOSTILE), monkeypatch) == 0
        out = capsys.readouterr().out
        assert "x[/]y[bold]" in out, out  # shown as it is: not markup
        assert not any(c in out for c in ESCAPES), repr(out)


def test_run_prints_model_output_without_escape_sequences(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    reply = ("Hi\x1b[2J\x1b[H there\x1b]0;owned\x07\r\n\tcol\x08\x9b31m "
             "\x1b]8;;http://evil.example/\x1b\\link\x1b]8;;\x1b\\ \x1b]52;c;b3duZWQ=\x07end")  # fmt: skip
    engine = FakeEngine(reply=reply)
    assert kvserve(["run", "fake-model", "hello"], engine, monkeypatch) == 0
    out = capsys.readouterr().out
    assert out == "Hi there\n\tcol link end\n", repr(out)


def test_an_error_in_the_chat_is_plain_text(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code = kvserve(["run", "\x1b]0;owned\x07[red]m", "hi"], FakeEngine(), monkeypatch)
    out = capsys.readouterr().out
    assert code == 1 and "[red]m" in out and not any(c in out for c in ESCAPES), repr(out)


def test_printable_keeps_text_newlines_and_tabs() -> None:
    assert printable("a\tb\nc ü 日本 [/] ok") == "a\tb\nc ü 日本 [/] ok"
    assert printable("\x00\x1b7\x1b(B\x1bPq#0\x1b\\\x7fz") == "z"


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_a_sequence_split_over_chunks_is_removed_whole(size: int) -> None:
    text = "a\x1b[31mred\x1b[0m b\x1b]0;title\x07c\x1b]8;;http://x\x1b\\d"
    shown = StreamFilter()
    chunks = [text[i : i + size] for i in range(0, len(text), size)]
    assert "".join(shown.feed(c) for c in chunks) + shown.finish() == "ared bcd"


def test_an_unfinished_sequence_is_not_held_for_ever() -> None:
    shown = StreamFilter()
    assert shown.feed("a\x1b]0;") == "a"
    out = shown.feed("x" * 5000)  # no terminator: past the bound it is let go (ESC removed)
    assert out.endswith("x" * 5000) and "\x1b" not in out
