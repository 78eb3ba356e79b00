"""The real agent clients' sessions replayed: Claude Code, Codex, opencode and Qwen Code, as
they sent them, against kvserve and llama-server (issue 46 item 3).

    python bench/agent_replay.py --validate          # load and check the sessions, no server
    python bench/agent_replay.py                     # Gemma 3 270M, 32k a slot, both servers
    python bench/agent_replay.py --sessions 4 --slots 2 --clients claude-code,qwen-code
    python bench/agent_replay.py --model smollm2 --n-ctx 8192 --clients opencode
    python bench/agent_replay.py --chat-template FILE  # one template for both servers

Each session in bench/agent_sessions/ is one client's tool loop captured from the client
itself (bench/replay_sessions.py): turn 1, then turn 2 resending turn 1 with the call the
capturing stand-in answered and the tool's output. A replay sends each turn's body as
captured, through the client's own API (`/v1/messages`, `/v1/responses`,
`/v1/chat/completions`) and with its API-relevant headers, streamed, with a short greedy
reply (`--reply-tokens`, temperature 0): what is measured is the processing of exactly
the prompts the clients send. Two modes, each on a freshly started server:
- alone: each client's session by itself, one client after another;
- several: `--sessions` copies of each client's session at once on `--slots` slots, each
  copy's task marked with its number (they share the system prompt and tools, not the
  conversation), as a team's shared server sees them.

Reported per client, server and mode: wall time, TTFT p50 of turn 1 and of turns 2+,
prompt tokens computed per turn (the server's own count: prompt minus cached, or
llama-server's `timings.prompt_n`) against the prompt's length, and requests that failed.
In the alone mode, also the grammar cost of the tool catalogue: turn 1 with its tools
against the same request with `tool_choice: none`, both warm and with a one-token reply,
alternated `--probe-rounds` times; the median difference is what the catalogue costs a
request beyond its warm prompt. llama-server renders the tools under none too (it only
builds no call grammar), so there it is the grammar; kvserve leaves them out of the prompt,
so there it is the grammar (built, or found in its memo) and the tools' rendering. The
prompt counts of both requests are printed beside it. Sessions a server cannot take are
skipped, with the reason their file gives (Codex's default-model session on
llama-server's /v1/responses).
The servers start one after another (bench/compare.py's `start`); --json appends rows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.replay_sessions import (  # noqa: E402
    MODEL,
    SESSION,
    Request,
    Session,
    fill,
    import_capture,
    load_all,
    problems,
)
from bench.replay_wire import NO_TOOLS, Reply, send  # noqa: E402

Connect = Callable[[], httpx.AsyncClient]

# Servers whose API does not honour tool_choice none: no grammar cost is measured there.
NO_PROBE = {("llama-server", "messages"): "llama-server's /v1/messages drops tool_choice "
            "{type: none} (server_chat_convert_anthropic_to_oai)"}  # fmt: skip


@dataclass
class Turn:
    session: str
    copy: int | None  # None: the session alone, as captured
    turn: int  # 0: a request sent beside turn 1 (opencode's title)
    reply: Reply


async def one(connect: Connect, api: str, request: Request) -> Reply:
    """A request on a fresh connection, as each client turn comes."""
    async with connect() as client:
        return await send(client, api, request)


async def replay(
    connect: Connect, session: Session, model: str, number: int | None, reply_tokens: int
) -> list[Turn]:
    """One copy of a session, turn after turn; it stops at a failed turn."""
    session_id = str(uuid.uuid4())
    turns: list[Turn] = []
    for k, request in enumerate(session.turns, 1):
        sent = fill(session, request, model, session_id, number, reply_tokens)
        side = [fill(session, s, model, session_id, None, reply_tokens)
                for s in (session.side if k == 1 else [])]  # fmt: skip
        replies = await asyncio.gather(*(one(connect, session.api, r) for r in [sent, *side]))
        turns.append(Turn(session.name, number, k, replies[0]))
        turns += [Turn(session.name, number, 0, r) for r in replies[1:]]
        if replies[0].error:
            break
    return turns


def summarize(turns: list[Turn], wall: float) -> dict:
    """A mode's figures for one client: TTFT medians of turn 1 and of later turns, and per
    turn the mean tokens computed and prompted per copy (side requests count in the
    totals only)."""
    main = [t for t in turns if t.turn > 0 and not t.reply.error]
    by_turn: dict[int, list[Reply]] = {}
    for t in main:
        by_turn.setdefault(t.turn, []).append(t.reply)
    first = [r.ttft for r in by_turn.get(1, [])]
    later = [t.reply.ttft for t in main if t.turn > 1]
    failed = [t for t in turns if t.reply.error]
    return {
        "wall_s": round(wall, 2),
        "ttft_p50_turn1_s": round(statistics.median(first), 3) if first else None,
        "ttft_p50_later_s": round(statistics.median(later), 3) if later else None,
        "computed_per_turn": [round(statistics.mean(r.computed for r in by_turn[k]))
                              for k in sorted(by_turn)],
        "prompt_per_turn": [round(statistics.mean(r.prompt for r in by_turn[k]))
                            for k in sorted(by_turn)],
        "computed_tokens": sum(t.reply.computed for t in turns if not t.reply.error),
        "prompt_tokens": sum(t.reply.prompt for t in turns if not t.reply.error),
        "errors": len(failed),
        "first_error": failed[0].reply.error if failed else "",
    }  # fmt: skip


async def run_mode(
    connect: Connect, session: Session, model: str, copies: int, reply_tokens: int
) -> dict:
    """The session alone (copies 0) or `copies` numbered copies of it at once."""
    numbers: list[int | None] = [None] if copies == 0 else list(range(1, copies + 1))
    started = time.perf_counter()
    done = await asyncio.gather(*(replay(connect, session, model, n, reply_tokens)
                                  for n in numbers))  # fmt: skip
    return summarize([t for ts in done for t in ts], time.perf_counter() - started)


def probe_summary(tools: list[Reply], none: list[Reply]) -> dict:
    """Turn 1 with its tools against tool_choice none, both warm: the medians, and their
    difference as what the tool catalogue costs a request beyond its warm prompt (the
    grammar, built or found, and on a server that leaves the tools out of the prompt under
    none, as kvserve does, their rendering: the prompt counts say which)."""
    if any(r.error for r in tools + none):
        return {"error": next(r.error for r in tools + none if r.error)}
    with_tools = statistics.median(r.total for r in tools)
    without = statistics.median(r.total for r in none)
    return {
        "tools_s": round(with_tools, 3),
        "none_s": round(without, 3),
        "grammar_ms": round((with_tools - without) * 1000, 1),
        "prompt_tools": tools[0].prompt,
        "prompt_none": none[0].prompt,
        "computed_tools": statistics.median(r.computed for r in tools),
        "computed_none": statistics.median(r.computed for r in none),
    }


async def grammar_cost(connect: Connect, session: Session, model: str, rounds: int) -> dict:
    """Turn 1 as the alone mode sent it (so its prompt is warm), with a one-token reply,
    and the same with tool_choice none: each sent once to warm it, then alternated."""
    request = fill(session, session.turns[0], model, str(uuid.uuid4()), None, 1)
    none = Request(
        request.path, request.headers, {**request.body, "tool_choice": NO_TOOLS[session.api]}
    )
    for warm in (request, none):
        await one(connect, session.api, warm)
    tools_replies, none_replies = [], []
    for _ in range(rounds):
        tools_replies.append(await one(connect, session.api, request))
        none_replies.append(await one(connect, session.api, none))
    return probe_summary(tools_replies, none_replies)


def skipped(session: Session, server: str) -> str:
    return next((why for name, why in session.skip.items() if server.startswith(name)), "")


def use_model(choice: str) -> None:
    """Point bench/compare.py's servers at the model: Gemma 3 270M assembled from its
    chunk packages (the test extra), SmolLM2 (the bundled default), or a GGUF path."""
    if choice == "smollm2":
        os.environ.pop("KVSERVE_BENCH_MODEL", None)
    elif choice == "gemma3-270m":
        from tests.helpers.family_models import assemble_gemma3_270m

        os.environ["KVSERVE_BENCH_MODEL"] = str(assemble_gemma3_270m())
    else:
        os.environ["KVSERVE_BENCH_MODEL"] = choice


async def measure(
    connect: Connect, session: Session, server: str, mode: str, model: str,
    args: argparse.Namespace,
) -> dict[str, Any]:  # fmt: skip
    """One client's row on one server in one mode (with the grammar cost when alone)."""
    row: dict[str, Any] = {"server": server, "mode": mode, "client": session.name}
    why = skipped(session, server)
    if why:
        return {**row, "skipped": why}
    copies = 0 if mode == "alone" else args.sessions
    row.update(await run_mode(connect, session, model, copies, args.reply_tokens))
    if mode == "alone" and args.probe_rounds:
        no_probe = next((why for (name, api), why in NO_PROBE.items()
                         if server.startswith(name) and api == session.api), "")  # fmt: skip
        row["grammar"] = {"skipped": no_probe} if no_probe else await grammar_cost(
            connect, session, model, args.probe_rounds)  # fmt: skip
    return row


def run_server(name: str, mode: str, sessions: list[Session], args: argparse.Namespace) -> list:
    from bench.compare import start

    proc, base, model = start(
        name, args.threads, args.slots, args.n_ctx, chat_template=args.chat_template
    )
    root = base.removesuffix("/v1")

    def connect() -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=root, timeout=3600)

    rows = []
    try:
        warm = httpx.post(
            f"{base}/chat/completions",
            timeout=600,
            json={"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
        )
        warm.raise_for_status()
        for session in sessions:
            row = asyncio.run(measure(connect, session, name, mode, model, args))
            print(json.dumps(row), file=sys.stderr)
            rows.append(row)
    finally:
        proc.terminate()
        proc.wait(30)
    return rows


def print_tables(rows: list[dict]) -> None:
    print("| client | server | mode | wall | TTFT p50 turn 1 | TTFT p50 turns 2+ "
          "| computed / prompt tokens per turn | failed |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "skipped" in r:
            print(f"| {r['client']} | {r['server']} | {r['mode']} | skipped: {r['skipped']} "
                  "| | | | |")  # fmt: skip
            continue
        per_turn = ", ".join(f"{c:,} / {p:,}"
                             for c, p in zip(r["computed_per_turn"], r["prompt_per_turn"],
                                             strict=True))  # fmt: skip
        print(f"| {r['client']} | {r['server']} | {r['mode']} | {r['wall_s']} s | "
              f"{r['ttft_p50_turn1_s']} s | {r['ttft_p50_later_s']} s | {per_turn} | "
              f"{r['errors']} {r['first_error'][:80]} |")  # fmt: skip
    print("\n| client | server | prompt tokens, tools / none | computed, tools / none "
          "| warm turn 1, tools / none | the tools' cost a request |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for r in rows:
        g = r.get("grammar")
        if not g:
            continue
        if "tools_s" not in g:
            print(f"| {r['client']} | {r['server']} | {g.get('skipped') or g.get('error')} "
                  "| | | |")  # fmt: skip
            continue
        print(f"| {r['client']} | {r['server']} | {g['prompt_tools']:,} / {g['prompt_none']:,} "
              f"| {g['computed_tools']} / {g['computed_none']} "
              f"| {g['tools_s']} / {g['none_s']} s | {g['grammar_ms']} ms |")  # fmt: skip
    for line in ratios(rows):
        print(line)


def ratios(rows: list[dict]) -> list[str]:
    """kvserve's wall time over llama-server's per client and mode (issue 46's goal:
    at most 0.5x with several sessions)."""
    walls = {(r["server"], r["mode"], r["client"]): r["wall_s"] for r in rows if "wall_s" in r}
    out = []
    for (server, mode, client), wall in walls.items():
        peer = walls.get(("llama-server", mode, client))
        if server.startswith("kvserve") and peer:
            out.append(f"{client}, {mode}: {server} / llama-server wall {wall / peer:.2f}x")
    return out


def validate(sessions: list[Session]) -> int:
    """--validate: every session checked and described, no server started."""
    found = [p for s in sessions for p in problems(s)]
    for s in sessions:
        sent = [fill(s, t, "served-model", "sid", 1, 16) for t in s.turns]
        left = [r for r in sent if MODEL in json.dumps(r.body) or SESSION in json.dumps(r.body)
                or SESSION in json.dumps(r.headers)]  # fmt: skip
        if left:
            found.append(f"{s.name}: a placeholder left after filling")
        index, _ = s.vary_at()
        sizes = " -> ".join(f"{len(json.dumps(t.body)):,}" for t in s.turns)
        print(f"{s.name} ({s.api}, {s.turns[0].path}): {len(s.turns)} turns, body chars "
              f"{sizes}; {len(s.side)} side request(s); copies marked in {s.items}[{index}]"
              + "".join(f"; skipped on {k}" for k in s.skip))  # fmt: skip
        print(f"    {s.client}")
    for p in found:
        print("PROBLEM:", p)
    print(f"{len(sessions)} sessions, {len(found)} problems")
    return 1 if found else 0


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--servers", default="kvserve,llama-server")
    p.add_argument("--clients", help="session names, comma-separated (default: all)")
    p.add_argument("--modes", default="alone,several", help="alone, several or both")
    p.add_argument("--sessions", type=int, default=4, help="copies at once in 'several'")
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--n-ctx", type=int, default=32768, help="context of one slot")
    p.add_argument("--model", default="gemma3-270m", help="gemma3-270m, smollm2 or a GGUF")
    p.add_argument("--chat-template", help="a Jinja file both servers use instead of the model's")
    p.add_argument("--reply-tokens", type=int, default=16)
    p.add_argument("--probe-rounds", type=int, default=3, help="0: no grammar cost")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", help="append each row to this JSON-lines file")
    p.add_argument("--validate", "--dry-run", action="store_true",
                   help="load and check the sessions; start no server")  # fmt: skip
    p.add_argument("--import-capture", type=Path, help="rewrite the sessions from a capture")
    args = p.parse_args()
    if args.import_capture:
        import_capture(args.import_capture)
    sessions = load_all()
    if args.clients:
        wanted = args.clients.split(",")
        sessions = [s for s in sessions if s.name in wanted]
    if args.validate or args.import_capture:
        sys.exit(validate(sessions))
    modes = [m for m in args.modes.split(",") if m]
    if set(modes) - {"alone", "several"}:
        p.error(f"--modes: {args.modes!r}: the modes are alone and several")
    use_model(args.model)
    rows = []
    for name in [s for s in args.servers.split(",") if s]:
        for mode in modes:
            rows += run_server(name, mode, sessions, args)
    if args.json:
        with open(args.json, "a") as f:
            for row in rows:
                f.write(json.dumps({**vars(args), **row}, default=str) + "\n")
    template = f", template {Path(args.chat_template).name}" if args.chat_template else ""
    print(
        f"model {args.model}{template}, {args.n_ctx} tokens a slot, {args.slots} slots, "
        f"{args.sessions} sessions at once in 'several', {args.reply_tokens}-token replies"
    )
    print_tables(rows)
    from bench.compare import print_peer

    print_peer([r["server"] for r in rows])


if __name__ == "__main__":
    main()
