"""`kvserve run MODEL [PROMPT]`: one answer, or a chat on the terminal.

With a prompt (or a prompt piped on stdin) it prints one streamed answer. With neither
and a terminal on stdin it is a conversation: each turn is sent with the history before
it (on the server's OpenAI chat route, streamed), `/clear` forgets the history, `/bye`
or Ctrl-D ends it, and Ctrl-C stops an answer in the middle.
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any

import httpx
from rich.console import Console

from server.cli_http import CommandError, check

HELP = "Type a message; /clear forgets the conversation, /bye (or Ctrl-D) ends it."


def run(client: httpx.Client, model: str, prompt: str | None, console: Console) -> int:
    name = _model_id(client, model)
    if prompt is None and not sys.stdin.isatty():
        prompt = sys.stdin.read()
    if prompt is not None:
        answer(client, name, [{"role": "user", "content": prompt}])
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
        try:
            reply = answer(client, name, history)
        except KeyboardInterrupt:
            reply = None
            console.print()
        if reply is None:  # interrupted: the question goes too
            history.pop()
        else:
            history.append({"role": "assistant", "content": reply})


def answer(client: httpx.Client, model: str, messages: list[dict[str, Any]]) -> str:
    """Stream one answer to stdout; the whole text."""
    body = {"model": model, "messages": messages, "stream": True}
    parts: list[str] = []
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if not r.is_success:
            check(r)
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: ") :])
            if "error" in event:
                raise CommandError(event["error"].get("message", str(event["error"])))
            for choice in event.get("choices", []):
                text = (choice.get("delta") or {}).get("content") or ""
                parts.append(text)
                sys.stdout.write(text)
                sys.stdout.flush()
    sys.stdout.write("\n\n" if sys.stdout.isatty() else "\n")
    sys.stdout.flush()
    return "".join(parts)


def _model_id(client: httpx.Client, name: str) -> str:
    """The id or alias the OpenAI route knows for an Ollama name (`x:latest` is `x`)."""
    known: list[str] = []
    for card in check(client.get("/v1/models"))["data"]:
        known += [card["id"], *card.get("meta", {}).get("aliases", [])]
    for candidate in (name, name.removesuffix(":latest"), f"{name}:latest"):
        if candidate in known:
            return candidate
    for candidate in known:
        if candidate.lower() in (name.lower(), name.lower().removesuffix(":latest")):
            return candidate
    raise CommandError(f"model '{name}' not found")
