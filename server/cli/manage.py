"""`kvserve pull|ls|ps|rm|run`: manage and talk to the models of a running kvserve.

They speak its Ollama routes over HTTP (httpx): /api/pull, /api/tags, /api/ps,
/api/delete, and /api/show with /api/chat for `run`; `rich` draws the progress bar and
the tables. `--host` (else KVSERVE_HOST, else http://127.0.0.1:8080) and `--api-key` (else
KVSERVE_API_KEY) name the server. `pull` with no server listening downloads into the
local hub cache instead, which a server serves from its next start.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
from collections.abc import Iterator

import httpx
from rich.console import Console
from rich.filesize import decimal
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.table import Table
from rich.text import Text

from server.cli.chat import run
from server.cli.http import CommandError, check, connect
from server.cli.text import plain, printable

NAMES = ("pull", "ls", "list", "ps", "rm", "run")
DEFAULT_HOST = "http://127.0.0.1:8080"
HUB_PREFIXES = ("hf.co/", "huggingface.co/")  # as server/models/hub_models.py reads them


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvserve", description="manage the models of a kvserve")
    sub = p.add_subparsers(dest="command", required=True)

    def command(name: str, help_: str, *aliases: str) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help_, aliases=list(aliases))
        c.add_argument("--host", default=os.environ.get("KVSERVE_HOST") or DEFAULT_HOST,
                       help="the server (env KVSERVE_HOST; default %(default)s)")  # fmt: skip
        c.add_argument("--api-key", default=os.environ.get("KVSERVE_API_KEY"),
                       help="its API key (env KVSERVE_API_KEY)")  # fmt: skip
        return c

    command("pull", "download a model from a Hugging Face hub").add_argument(
        "model", help="org/repo[:QUANT] or hf.co/org/repo[:QUANT]"
    )
    command("ls", "list the models", "list")
    command("ps", "list the loaded models")
    command("rm", "delete pulled models (and names made by copy)").add_argument("models", nargs="+")
    run = command("run", "chat with a model: one answer, or a conversation")
    run.add_argument("model")
    run.add_argument("prompt", nargs="*", help="the prompt (none: a chat on the terminal)")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    console = Console(highlight=False)
    try:
        with connect(args.host, args.api_key) as client:
            if args.command == "pull":
                return pull(client, args.model, console)
            if args.command in ("ls", "list"):
                return ls(client, console)
            if args.command == "ps":
                return ps(client, console)
            if args.command == "rm":
                return rm(client, args.models, console)
            return run(client, args.model, " ".join(args.prompt) or None, console)
    except CommandError as exc:
        console.print(_error(str(exc)))
        return 1
    except httpx.TransportError as exc:
        console.print(_error(f"cannot reach the server at {args.host}: {exc}"))
        return 1


def _error(message: str) -> Text:
    """An error line: the message (the server's words, often) as plain text."""
    return Text.assemble(("Error:", "red"), " ", plain(message))


def pull(client: httpx.Client, model: str, console: Console) -> int:
    name = model if model.lower().startswith(HUB_PREFIXES) else f"hf.co/{model}"
    try:
        with client.stream("POST", "/api/pull", json={"model": name}) as r:
            if not r.is_success:
                check(r)
            _show_progress(r.iter_lines(), console)
    except httpx.ConnectError:
        return _pull_here(name, console)
    return 0


def _show_progress(lines: Iterator[str], console: Console) -> None:
    # the descriptions are the server's status lines: shown as text, not markup
    with Progress(TextColumn("{task.description}", markup=False), BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), console=console) as bar:  # fmt: skip
        task = None
        for line in lines:
            event = json.loads(line)
            if "error" in event:
                raise CommandError(event["error"])
            if "total" in event:
                if task is None:
                    task = bar.add_task(printable(str(event["status"])), total=event["total"])
                bar.update(task, completed=event.get("completed", 0))
            else:
                bar.console.print(plain(event["status"]))


def _pull_here(name: str, console: Console) -> int:
    """No server: into the local hub cache (a server serves it from its next start)."""
    # Here, not at the top: the other commands start without the server's modules
    # (server.models.hub_models loads FastAPI and the engine).
    from server.config.hub import HubError, HubSource
    from server.models import hub
    from server.models.hub_models import HubName

    wanted = HubName.parse(name)
    if wanted is None:
        raise CommandError(f"{name}: expected org/repo[:QUANT]")
    console.print("no server is listening: downloading into the local hub cache")
    try:
        source = HubSource.parse("model", wanted.spec)
        with Progress(TextColumn("{task.description}", markup=False), BarColumn(),
                      console=console) as bar:  # fmt: skip
            task = bar.add_task(printable(f"pulling {wanted.name}"), total=1.0)
            path = hub.fetch(source, lambda f: bar.update(task, completed=f))
    except HubError as exc:
        raise CommandError(str(exc)) from None
    console.print(plain(f"{path}\nsuccess"))
    return 0


def ls(client: httpx.Client, console: Console) -> int:
    table = _table("NAME", "ID", "SIZE", "MODIFIED")
    for m in check(client.get("/api/tags"))["models"]:
        modified = dt.datetime.fromisoformat(m["modified_at"])
        table.add_row(plain(m["name"]), plain(m["digest"][:12]), decimal(m["size"]),
                      _ago(modified))  # fmt: skip
    console.print(table)
    return 0


def ps(client: httpx.Client, console: Console) -> int:
    table = _table("NAME", "ID", "SIZE", "CONTEXT", "UNTIL")
    for m in check(client.get("/api/ps"))["models"]:
        until = dt.datetime.fromisoformat(m["expires_at"])
        table.add_row(plain(m["name"]), plain(m["digest"][:12]), decimal(m["size"]),
                      plain(m.get("context_length", "")), _until(until))  # fmt: skip
    console.print(table)
    return 0


def rm(client: httpx.Client, models: list[str], console: Console) -> int:
    for model in models:
        check(client.request("DELETE", "/api/delete", json={"model": model}))
        console.print(plain(f"deleted '{model}'"))
    return 0


def _table(*columns: str) -> Table:
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column, no_wrap=True)
    return table


def _ago(when: dt.datetime) -> str:
    return _span(dt.datetime.now(dt.UTC) - when) + " ago"


def _until(when: dt.datetime) -> str:
    left = when - dt.datetime.now(dt.UTC)
    if left > dt.timedelta(days=365 * 100):
        return "Forever"
    return "Stopping..." if left.total_seconds() <= 0 else _span(left) + " from now"


def _span(delta: dt.timedelta) -> str:
    seconds = int(delta.total_seconds())
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        if seconds >= size:
            n = seconds // size
            return f"{n} {unit}{'s' if n != 1 else ''}"
    return "less than a second"
