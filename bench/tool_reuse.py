"""Prompt tokens computed per turn of a tool loop, with the replay of sampled tool turns
off (`[replay] max_bytes = 0`) and on (issue 47 item 3).

    python bench/tool_reuse.py [--model GGUF] [--chat-template FILE] [--conversations 3]

For each setting a kvserve is started (`--chat-template FILE`, default the Hermes template
of Qwen3, tests/chat/templates/Qwen-Qwen3-0.6B.jinja, on the bundled SmolLM2; `--model`
for another GGUF, e.g. Gemma 3), and a few conversations of TURNS turns are run through
Chat Completions, greedy: turn 1 forces a call (`tool_choice: "required"`), later turns
leave it to the model (`"auto"`). Each call gets a tool result; a turn that answers in
text gets the next question instead, so every conversation has TURNS turns. Reported per
turn (the median over conversations): prompt tokens, cached tokens, and prompt tokens
computed (prompt - cached). Without the replay a call sent back renders as the template
writes it, not as the model sampled it, so the turn after a call computes everything
from the call on again; with it, only what is new.

One warm-up conversation runs first and is not counted (it computes the shared head:
system prompt, tool descriptions). The two servers run one after the other, each with an
empty cache directory of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script

from bench.mcp_loop import free_port, wait_http  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
HERMES = ROOT / "tests" / "chat" / "templates" / "Qwen-Qwen3-0.6B.jinja"
TURNS = 4
SENT_BACK = ("role", "content", "tool_calls")  # an assistant message's keys a client resends
MAX_TOKENS = 64
SYSTEM = "You are a travel assistant. Look facts up with the tools before you answer."
CITIES = ("Paris", "Lyon", "Tokyo", "Lima", "Oslo", "Cairo", "Quito", "Perth")
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather of a city today",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 24}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The local time in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 24}}, "required": ["city"]}}},
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class TurnFigures:
    turn: int  # 1-based
    prompt_tokens: int
    cached_tokens: int
    calls: int  # tool calls the turn made

    @property
    def computed(self) -> int:
        return self.prompt_tokens - self.cached_tokens


def questions(city: str) -> list[str]:
    """What the user asks: one question a turn (a turn that answered in text gets the next)."""
    return [
        f"What is the weather in {city}?",
        f"And the local time in {city}?",
        f"Is {city} warmer than Oslo?",
        f"What time is it in Tokyo compared to {city}?",
    ]


def tool_result(call: dict[str, Any]) -> str:
    """A fixed answer per tool, so both settings see the same conversation."""
    args = json.loads(call["function"]["arguments"] or "{}")
    city = args.get("city", "?")
    if call["function"]["name"] == "get_time":
        return json.dumps({"city": city, "time": "14:05"})
    return json.dumps({"city": city, "sky": "cloudy", "celsius": 17})


async def conversation(
    http: httpx.AsyncClient, model: str, city: str, max_tokens: int = MAX_TOKENS
) -> list[TurnFigures]:
    """One tool loop of TURNS turns; the figures of each."""
    asked = questions(city)
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": asked.pop(0)}]  # fmt: skip
    figures = []
    for n in range(1, TURNS + 1):
        body = {"model": model, "messages": messages, "tools": TOOLS, "temperature": 0,
                "max_tokens": max_tokens, "parallel_tool_calls": False,
                "tool_choice": "required" if n == 1 else "auto"}  # fmt: skip
        r = await http.post("/v1/chat/completions", json=body)
        r.raise_for_status()
        reply = r.json()
        usage, message = reply["usage"], reply["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        figures.append(TurnFigures(n, usage["prompt_tokens"], cached, len(calls)))
        # Sent back as a client sends it: the message as it came, then what is new.
        messages.append({k: v for k, v in message.items() if k in SENT_BACK})
        if calls:
            messages += [{"role": "tool", "tool_call_id": c["id"], "content": tool_result(c)}
                         for c in calls]  # fmt: skip
        else:
            messages.append({"role": "user", "content": asked.pop(0) if asked else "Thanks."})
    return figures


def summarize(runs: Sequence[Sequence[TurnFigures]]) -> list[dict[str, float]]:
    """Per turn, the medians over conversations (prompt, cached, computed, calls)."""
    rows = []
    for figures in zip(*runs, strict=True):
        rows.append({
            "turn": figures[0].turn,
            "prompt_tokens": statistics.median(f.prompt_tokens for f in figures),
            "cached_tokens": statistics.median(f.cached_tokens for f in figures),
            "computed": statistics.median(f.computed for f in figures),
            "calls": statistics.median(f.calls for f in figures),
        })  # fmt: skip
    return rows


def table(results: dict[str, list[dict[str, float]]]) -> str:
    lines = [f"{'replay':7} {'turn':>4} {'prompt':>7} {'cached':>7} {'computed':>9} {'calls':>6}"]
    for name, rows in results.items():
        for row in rows:
            lines.append(f"{name:7} {row['turn']:4.0f} {row['prompt_tokens']:7.0f} "
                         f"{row['cached_tokens']:7.0f} {row['computed']:9.0f} "
                         f"{row['calls']:6.1f}")  # fmt: skip
        total = sum(row["computed"] for row in rows)
        lines.append(f"{name:7} {'all':>4} {'':7} {'':7} {total:9.0f}")
    return "\n".join(lines)


async def measure(url: str, model: str, conversations: int) -> list[dict[str, float]]:
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        await conversation(http, model, "Rome")  # warm-up: the shared head, not counted
        runs = [await conversation(http, model, CITIES[i % len(CITIES)])
                for i in range(conversations)]  # fmt: skip
    return summarize(runs)


def serve(args: argparse.Namespace, replay_bytes: int | None, tmp: Path) -> dict[str, Any]:
    """Start a kvserve with `[replay] max_bytes` (None: the default) and measure on it."""
    port = free_port()
    config = tmp / "kvserve.toml"
    config.write_text("" if replay_bytes is None else f"[replay]\nmax_bytes = {replay_bytes}\n")
    command = [sys.executable, "-m", "server", "--port", str(port), "--config", str(config),
               "--chat-template", str(args.chat_template), "--model-id", args.model_id]  # fmt: skip
    if args.model:
        command += ["--model", str(args.model)]
    proc = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "XDG_CACHE_HOME": str(tmp)},
                            stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/health")
        return {"rows": asyncio.run(measure(url, args.model_id, args.conversations))}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="GGUF (default: the bundled SmolLM2)")
    parser.add_argument("--model-id", default="bench")
    parser.add_argument("--chat-template", type=Path, default=HERMES)
    parser.add_argument("--conversations", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    results = {}
    for name, replay_bytes in (("off", 0), ("on", None)):
        with tempfile.TemporaryDirectory() as tmp:
            results[name] = serve(args, replay_bytes, Path(tmp))["rows"]
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "results": results}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
