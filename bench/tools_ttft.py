"""TTFT with 20 tools: the first request vs the same tools resent (as agents do).

    python bench/tools_ttft.py --base-url http://127.0.0.1:8080/v1 --requests 6

Each request streams with tool_choice=required and a different user question, so the
tools' part of the prompt is shared and the question is new. TTFT is the time to the
first chunk that carries a tool call. Also times, in process, the pieces the grammar
cache saves: schema -> GBNF conversion and llama.cpp's grammar compile.
Run by hand; results go in the README.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import httpx

QUESTIONS = ["Weather in Paris?", "Add 2 and 3.", "Time in Tokyo?", "Find cafes in Rome.",
             "Convert 5 km to miles.", "Translate hello to French.", "Book a table for two.",
             "What is 7 times 8?"]  # fmt: skip


def tools(count: int) -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {
            "name": f"tool_{i}", "description": f"Tool number {i} of the benchmark",
            "parameters": {"type": "object", "properties": {
                "query": {"type": "string", "maxLength": 20},
                "count": {"type": "integer", "minimum": 0, "maximum": 9},
                "mode": {"enum": ["fast", "exact"]}}, "required": ["query", "mode"]}}}
        for i in range(count)
    ]  # fmt: skip


def ttft(client: httpx.Client, model: str, question: str, tool_list: list[dict[str, Any]]) -> float:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "tools": tool_list,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": 60,
        "stream": True,
    }
    start = time.perf_counter()
    first = None
    with client.stream("POST", "/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if first is None and line.startswith("data: {") and '"tool_calls"' in line:
                first = time.perf_counter() - start
    return first if first is not None else float("nan")


def in_process(tool_list: list[dict[str, Any]]) -> None:
    from chat.formats import GENERIC
    from chat.tools import Tool, ToolChoice
    from engine.llama import Model, Sampler
    from engine.types import SamplingParams
    from server.config.tree import default_model_path

    specs = [Tool(t["function"]["name"], "", t["function"]["parameters"]) for t in tool_list]
    t0 = time.perf_counter()
    spec = GENERIC.grammar(specs, ToolChoice("required"), True)
    t1 = time.perf_counter()
    GENERIC.grammar(specs, ToolChoice("required"), True)
    t2 = time.perf_counter()
    print(f"schema->GBNF: first {1000 * (t1 - t0):.2f} ms, cached {1000 * (t2 - t1):.3f} ms")
    model = Model(default_model_path())
    for _ in range(3):
        t0 = time.perf_counter()
        Sampler(model, SamplingParams(grammar=spec.gbnf), 1, 64).close()
        print(f"llama.cpp grammar compile: {1000 * (time.perf_counter() - t0):.2f} ms")
    model.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--model", default="SmolLM2-135M-Instruct")
    ap.add_argument("--tools", type=int, default=20)
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--in-process", action="store_true", help="also time conversion/compile")
    args = ap.parse_args()
    tool_list = tools(args.tools)
    if args.in_process:
        in_process(tool_list)
    with httpx.Client(base_url=args.base_url, timeout=600) as client:
        times = [
            ttft(client, args.model, QUESTIONS[i % len(QUESTIONS)], tool_list)
            for i in range(args.requests)
        ]
    print(json.dumps({"first_s": round(times[0], 3), "later_s": [round(t, 3) for t in times[1:]]}))


if __name__ == "__main__":
    main()
