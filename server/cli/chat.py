"""`kvserve run MODEL [PROMPT]`: one answer, or a chat on the terminal.

With a prompt (or a prompt piped on stdin) it prints one streamed answer. With neither
and a terminal on stdin it is a conversation: each turn is sent with the history before
it on Ollama's chat route (streamed NDJSON), as `ollama run` sends it. The route drops
the oldest turns once the history outgrows the model's context (`truncate`), so a long
conversation goes on; an error from the server ends that turn, not the conversation.
`/clear` forgets the history, `/bye` or Ctrl-D ends it, and Ctrl-C stops an answer in
the middle.
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any

import httpx
from rich.console import Console

from server.cli.http import CommandError, check
from server.cli.text import StreamFilter, plain

HELP = "Type a message; /clear forgets the conversation, /bye (or Ctrl-D) ends it."


def run(client: httpx.Client, model: str, prompt: str | None, console: Console) -> int:
    _require_model(client, model)
    if prompt is None and not sys.stdin.isatty():
        prompt = sys.stdin.read()
    if prompt is not None:
        answer(client, model, [{"role": "user", "content": prompt}])
        return 0
    with contextlib.suppress(ImportError):
        import readline  # noqa: F401  (line editing and history for input())
    console.print(HELP, style="dim")
    history: list[dict[str, Any]] = []
    while True:
        try:
            line = console.input(">>> ")
        except EOFError:
            console.print()
            return 0
        except KeyboardInterrupt:
            console.print("\nUse Ctrl + d or /bye to exit.")
            continue
        text = line.strip()
        if text == "/bye":
            return 0
        if text == "/clear":
            history.clear()
            console.print("Cleared the conversation.", style="dim")
            continue
        if not text:
            continue
        history.append({"role": "user", "content": line})
        reply = _turn(client, model, history, console)
        if reply is None:  # interrupted or refused: the question goes too
            history.pop()
        else:
            history.append({"role": "assistant", "content": reply})


def _turn(
    client: httpx.Client, model: str, history: list[dict[str, Any]], console: Console
) -> str | None:
    """One answer in a conversation; None if Ctrl-C stopped it or the server refused it
    (the error is shown and the conversation goes on)."""
    try:
        return answer(client, model, history, truncate=True)
    except KeyboardInterrupt:
        console.print()
    except CommandError as exc:
        console.print(plain(f"Error: {exc}"), style="red", highlight=False)
    return None


def answer(
    client: httpx.Client, model: str, messages: list[dict[str, Any]], truncate: bool = False
) -> str:
    """Stream one answer to stdout; the whole text (as the model wrote it: the history
    keeps it so; the terminal gets it without control and escape sequences). `truncate`:
    the server may drop the oldest turns to fit the context (false: a history too long is
    refused)."""
    body = {"model": model, "messages": messages, "stream": True, "truncate": truncate}
    parts: list[str] = []
    shown = StreamFilter()
    with client.stream("POST", "/api/chat", json=body) as r:
        if not r.is_success:
            check(r)
        for line in r.iter_lines():
            if not line.strip():
                continue
            event = json.loads(line)
            if "error" in event:  # Ollama's in-stream error line
                raise CommandError(str(event["error"]))
            text = (event.get("message") or {}).get("content") or ""
            parts.append(text)
            sys.stdout.write(shown.feed(text))
            sys.stdout.flush()
    sys.stdout.write(shown.finish() + ("\n\n" if sys.stdout.isatty() else "\n"))
    sys.stdout.flush()
    return "".join(parts)


def _require_model(client: httpx.Client, name: str) -> None:
    """CommandError unless the server knows `name` (Ollama's show route resolves names
    as its chat route does): an unknown name fails before the first question, as
    `ollama run` fails."""
    check(client.post("/api/show", json={"model": name}))
