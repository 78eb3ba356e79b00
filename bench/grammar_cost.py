"""What a grammar costs a generated token (issue 47 item 5): tokens/s of generation with
and without a grammar, on kvserve and llama-server, the same prompts on both.

    python bench/grammar_cost.py                   # SmolLM2, both servers, 3 rounds
    python bench/grammar_cost.py --rounds 1 --servers kvserve

Cases, each against the same request without its grammar (one server, one slot, greedy):
- schema: `response_format` with a nested JSON schema (an order: a customer object, a
  list of line items with enums, bounded strings and numbers, an address);
- tools: 40 tools offered with `tool_choice: "required"` (the call grammar of the
  whole catalogue, in the template's call syntax); its plain twin carries the catalogue's
  JSON as a system message instead, so that both attend over prompts of about one length
  (`tool_choice: "none"` would not do: kvserve leaves the tools out of the prompt then).
Both servers use one template with tool syntax (`--chat-template`, default Qwen 2.5's
Hermes template from tests/chat/templates/), so they render the tools alike.
The rate is generation only: llama-server's `timings.predicted_per_second` and kvserve's
same object (`timings_per_token: true`), so prefill and the prompt's length stay out of
it. Each request asks for at most `--tokens` tokens (the plain twin generates them all:
`ignore_eos`; a call under a grammar ends where the call does); a reply of fewer than 12
tokens is not timed. Every case runs `--rounds`
times, alternating with its plain twin; medians are reported, with the grammar's cost
a token: 1000/rate(grammar) - 1000/rate(plain) ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.compare import start  # noqa: E402

TEMPLATES = Path(__file__).resolve().parent.parent / "tests" / "chat" / "templates"
HERMES = TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja"
ORDER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "customer": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 40},
                "email": {"type": "string", "maxLength": 60},
                "tier": {"enum": ["basic", "plus", "pro"]},
            },
            "required": ["name", "email", "tier"],
        },
        "items": {
            "type": "array",
            "minItems": 1,
            "maxItems": 6,
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "maxLength": 12},
                    "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                    "price": {"type": "number"},
                    "color": {"enum": ["red", "green", "blue", "black", "white"]},
                },
                "required": ["sku", "quantity", "price"],
            },
        },
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string", "maxLength": 60},
                "city": {"type": "string", "maxLength": 30},
                "zip": {"type": "string", "maxLength": 10},
            },
            "required": ["street", "city", "zip"],
        },
        "notes": {"type": "string", "maxLength": 200},
    },
    "required": ["customer", "items", "address", "notes"],
}


def catalogue(count: int) -> list[dict[str, Any]]:
    """`count` tools with a few typed parameters each, as agent catalogues look."""
    kinds = [{"type": "string"}, {"type": "integer"}, {"type": "boolean"},
             {"enum": ["asc", "desc"]}, {"type": "array", "items": {"type": "string"}}]  # fmt: skip
    return [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i:02d}",
                "description": f"Tool number {i}: does task {i} on the given inputs.",
                "parameters": {
                    "type": "object",
                    "properties": {f"arg_{j}": kinds[(i + j) % len(kinds)] for j in range(3)},
                    "required": ["arg_0"],
                },
            },
        }
        for i in range(count)
    ]


def cases(tokens: int) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """name -> (request with its grammar, the same request without it)."""
    order = "Write an order for three items for a customer in Lyon, as JSON."
    schema_prompt = [{"role": "user", "content": order}]
    tools_prompt = [{"role": "user", "content": "Use tool_07 on the file notes.txt."}]
    base = {"max_tokens": tokens, "temperature": 0, "timings_per_token": True}
    # The plain twins generate all `tokens` (the rate of an answer cut short is noise).
    plain = {**base, "ignore_eos": True}
    schema = {"type": "json_schema", "json_schema": {"name": "order", "schema": ORDER_SCHEMA}}
    tool_list = catalogue(40)
    return {
        "schema": ({**base, "messages": schema_prompt, "response_format": schema},
                   {**plain, "messages": schema_prompt}),
        "tools": ({**base, "messages": tools_prompt, "tools": tool_list, "tool_choice": "required"},
                  {**plain, "messages": [{"role": "system", "content": json.dumps(tool_list)},
                                         *tools_prompt]}),
    }  # fmt: skip


MIN_TIMED = 12  # generated tokens: fewer are too few steps to time


def rate(reply: dict[str, Any], tokens: int) -> float | None:
    """Generation tokens/s of a reply, None when it is too short to time."""
    t = reply.get("timings") or {}
    if int(t.get("predicted_n", 0)) < MIN_TIMED:
        return None
    per_second = t.get("predicted_per_second")
    return float(per_second) if per_second else None


def cost_ms(with_grammar: float, plain: float) -> float:
    """What the grammar adds to a token, in ms."""
    return 1000 / with_grammar - 1000 / plain


def measure(base: str, model: str, rounds: int, tokens: int) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    prompts: dict[str, int] = {}
    with httpx.Client(base_url=base, timeout=600) as client:
        for name, (grammar, plain) in cases(tokens).items():
            rates: dict[str, list[float]] = {"grammar": [], "plain": []}
            for _ in range(rounds + 1):  # the first round warms the prompt and the memo
                for label, body in (("grammar", grammar), ("plain", plain)):
                    reply = client.post("/chat/completions", json={**body, "model": model})
                    reply.raise_for_status()
                    prompts[label] = reply.json()["usage"]["prompt_tokens"]
                    r = rate(reply.json(), tokens)
                    if r is not None:
                        rates[label].append(r)
            rates = {k: v[1:] if len(v) > 1 else v for k, v in rates.items()}
            row: dict[str, Any] = {k: statistics.median(v) if v else None for k, v in rates.items()}
            row["prompts"] = f"{prompts['grammar']:,} / {prompts['plain']:,}"
            if row["grammar"] and row["plain"]:
                row["cost_ms"] = round(cost_ms(row["grammar"], row["plain"]), 2)
            out[name] = row
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--servers", default="kvserve,llama-server")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--chat-template", default=str(HERMES), help="a Jinja file for both servers")
    args = p.parse_args()
    print("| server | case | prompt tokens, with / without | tok/s with grammar "
          "| tok/s without | grammar's cost a token |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for name in args.servers.split(","):
        proc, base, model = start(name, args.threads, 1, 8192, chat_template=args.chat_template)
        try:
            rows = measure(base, model, args.rounds, args.tokens)
        finally:
            proc.terminate()
            proc.wait(30)
        for case, row in rows.items():
            g, n = row["grammar"], row["plain"]
            cost = f"{row['cost_ms']} ms" if "cost_ms" in row else "(a reply too short)"
            print(f"| {name} | {case} | {row['prompts']} | {g and round(g, 1)} "
                  f"| {n and round(n, 1)} | {cost} |")  # fmt: skip


if __name__ == "__main__":
    main()
