"""`kvserve run` (server/cli/chat.py) against the app on the fake engine: a chat that
outgrows the model's context goes on (Ollama's chat route drops the oldest turns), an
error from the server ends a turn and not the chat, an unknown model fails first."""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator

import pytest
from rich.console import Console
from starlette.testclient import TestClient

from server.app import create_app
from server.cli.chat import run
from server.cli.http import CommandError
from server.config.tree import Settings
from tests.fakes import FakeEngine

MODEL = "fake-model"


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine(n_ctx=256, reply="A long enough answer to fill the context. " * 2)


@pytest.fixture
def client(fake: FakeEngine) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(), engine=fake)) as c:
        yield c


def _chat(
    client: TestClient, lines: list[str], monkeypatch: pytest.MonkeyPatch, model: str = MODEL
) -> tuple[int, str]:
    """Run the chat with `lines` typed at its prompt (then Ctrl-D); its code and what it
    showed on the console."""
    typed = iter(lines)

    def read(prompt: str = "") -> str:
        try:
            return next(typed)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    out = io.StringIO()
    console = Console(file=out, width=200)
    monkeypatch.setattr(console, "input", read)
    return run(client, model, None, console), out.getvalue()


def test_a_chat_longer_than_the_context_goes_on(
    client: TestClient, fake: FakeEngine, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    turns = [f"Question number {i}?" for i in range(8)]
    code, shown = _chat(client, turns, monkeypatch)
    assert code == 0 and "Error" not in shown, shown
    assert capsys.readouterr().out.count("A long enough answer") == 2 * len(turns)
    # the history outgrew 256 tokens: the last turn went without the oldest ones
    last = fake.submitted[-1].prompt_tokens
    assert len(fake.submitted) == len(turns) and len(last) <= 256
    assert b"Question number 7?" in bytes(last) and b"Question number 0?" not in bytes(last)


def test_an_error_ends_the_turn_not_the_chat(
    client: TestClient, fake: FakeEngine, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    too_long = "word " * 300  # the last turn alone: nothing left to drop
    code, shown = _chat(client, ["Hi", too_long, "Still there?"], monkeypatch)
    assert code == 0
    assert "Error:" in shown and "context" in shown, shown
    assert capsys.readouterr().out.count("A long enough answer") == 2 * 2
    # the refused question is not kept: the third turn carries the first, not it
    last = bytes(fake.submitted[-1].prompt_tokens)
    assert b"Hi" in last and b"word word" not in last and b"Still there?" in last


def test_an_unknown_model_fails_before_the_first_question(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(CommandError, match="not found"):
        _chat(client, ["Hi"], monkeypatch, model="nope")
    code, _ = _chat(client, [], monkeypatch, model=f"{MODEL}:latest")  # Ollama's tag
    assert code == 0
