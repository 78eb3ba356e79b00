"""A 3-call tool task done by kvserve's MCP loop versus the same task done by a client
loop over HTTP.

    python bench/mcp_loop.py [--repeats 3] [--calls 3]

Starts the test MCP server (tests/mcp/tool_server.py, streamable HTTP on loopback) and a
kvserve configured with it, then, for each repeat and a fresh question each time:

- server loop: one POST /v1/responses with the `mcp` tool, `tool_choice: "required"` and
  `[mcp] max_tool_iterations = calls`: kvserve calls `add` `calls` times, each round on
  the previous round's KV, then answers;
- client loop: the same tool as a `function` tool; `calls` requests with
  `tool_choice: "required"`, the client calling the MCP server itself between them (the
  official SDK) and sending the whole conversation back, then a last request for the
  answer (`tool_choice: "none"`).

Reported per side: wall time, and the prompt tokens the server computed (prompt minus
`cached_tokens`, summed over its rounds or requests). Greedy, short answers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from mcp import Client

ROOT = Path(__file__).resolve().parent.parent
MODEL = "SmolLM2-135M-Instruct"
SYSTEM = "You add numbers with the add tool, one addition per call. " * 6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not come up")


def computed(usage: dict[str, Any]) -> int:
    return int(usage["input_tokens"] - usage["input_tokens_details"]["cached_tokens"])


async def server_loop(http: httpx.AsyncClient, question: str) -> tuple[float, int, int]:
    start = time.perf_counter()
    r = await http.post("/v1/responses", json={
        "model": MODEL, "instructions": SYSTEM, "input": question, "temperature": 0,
        "max_output_tokens": 96, "store": False, "tool_choice": "required",
        "parallel_tool_calls": False,
        "tools": [{"type": "mcp", "server_label": "bench", "require_approval": "never",
                   "allowed_tools": ["add"]}]})  # fmt: skip
    r.raise_for_status()
    body = r.json()
    calls = sum(1 for i in body["output"] if i["type"] == "mcp_call")
    return time.perf_counter() - start, computed(body["usage"]), calls


async def client_loop(http: httpx.AsyncClient, mcp: Client, question: str,
                      calls: int) -> tuple[float, int, int]:  # fmt: skip
    listed = (await mcp.list_tools()).tools
    add = next(t for t in listed if t.name == "add")
    tools = [{"type": "function", "name": "add", "description": add.description or "",
              "parameters": add.input_schema}]  # fmt: skip
    items: list[dict[str, Any]] = [{"role": "user", "content": question}]
    start, total, made = time.perf_counter(), 0, 0
    for n in range(calls + 1):
        r = await http.post("/v1/responses", json={
            "model": MODEL, "instructions": SYSTEM, "input": items, "temperature": 0,
            "max_output_tokens": 96, "store": False, "tools": tools,
            "parallel_tool_calls": False,
            "tool_choice": "required" if n < calls else "none"})  # fmt: skip
        r.raise_for_status()
        body = r.json()
        total += computed(body["usage"])
        if n == calls:
            break
        for item in body["output"]:
            if item["type"] != "function_call":
                continue
            result = await mcp.call_tool("add", json.loads(item["arguments"]))
            text = "".join(getattr(c, "text", "") for c in result.content)
            items += [{k: item[k] for k in ("type", "call_id", "name", "arguments")},
                      {"type": "function_call_output", "call_id": item["call_id"],
                       "output": text}]  # fmt: skip
            made += 1
    return time.perf_counter() - start, total, made


async def run(url: str, mcp_url: str, repeats: int, calls: int) -> None:
    questions = [f"What is {a} plus {a + 7} plus {a * 3} plus {a + 11}?"
                 for a in range(13, 13 + 2 * repeats)]  # fmt: skip
    results: dict[str, list[tuple[float, int, int]]] = {"server loop": [], "client loop": []}
    async with httpx.AsyncClient(base_url=url, timeout=600) as http, Client(mcp_url) as mcp:
        # Warm-up, not counted: the first request computes the shared head (instructions,
        # tool descriptions) cold, and every later one of either side reuses it.
        await server_loop(http, "What is 1 plus 2 plus 3 plus 4?")
        await client_loop(http, mcp, "What is 5 plus 6 plus 7 plus 8?", calls)
        for i in range(repeats):
            results["server loop"].append(await server_loop(http, questions[2 * i]))
            results["client loop"].append(await client_loop(http, mcp, questions[2 * i + 1],
                                                            calls))  # fmt: skip
    print(f"{'':12} {'wall s (median)':>16} {'prompt tokens computed':>24} {'calls':>6}")
    for name, rows in results.items():
        print(f"{name:12} {statistics.median(r[0] for r in rows):16.2f} "
              f"{statistics.median(r[1] for r in rows):24.0f} "
              f"{statistics.median(r[2] for r in rows):6.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        mcp_port, port = free_port(), free_port()
        mcp_url = f"http://127.0.0.1:{mcp_port}/mcp"
        config = Path(tmp) / "kvserve.toml"
        config.write_text(f"[mcp]\nmax_tool_iterations = {args.calls}\n\n"
                          f'[[mcp_servers]]\nlabel = "bench"\nurl = "{mcp_url}"\n')  # fmt: skip
        script = str(ROOT / "tests" / "mcp" / "tool_server.py")
        procs = [
            subprocess.Popen([sys.executable, script, "http", str(mcp_port),
                              str(Path(tmp) / "mcp.log")], stderr=subprocess.DEVNULL),
            subprocess.Popen([sys.executable, "-m", "server", "--port", str(port), "--config",
                              str(config)], cwd=ROOT, env={**os.environ,
                              "XDG_CACHE_HOME": tmp}, stderr=subprocess.DEVNULL),
        ]  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            wait_http(f"{url}/health")
            wait_http(mcp_url.replace("/mcp", "/"))
            asyncio.run(run(url, mcp_url, args.repeats, args.calls))
        finally:
            for proc in reversed(procs):  # kvserve first: it holds the MCP server's stream
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


if __name__ == "__main__":
    main()
