"""One replayed request on the wire: send it, read its stream, and say when the first
generated token came and how many prompt tokens the server computed.

The three APIs stream differently, and kvserve and llama-server count differently:
- first token: the first event that carries generated output (a chat delta with content,
  reasoning or a tool call; Anthropic's `content_block_delta` or a `tool_use` block's
  start; a Responses `*.delta` or a call item added). Not `message_start`: kvserve sends
  it at once, llama-server with the first token.
- prompt and cached tokens: chat `usage.prompt_tokens` and `prompt_tokens_details.
  cached_tokens`; Anthropic `input_tokens` (computed) plus `cache_read_input_tokens`
  (reused) plus `cache_creation_input_tokens`, merged from `message_start` (llama-server
  counts only there) and `message_delta`; Responses `usage.input_tokens` and
  `input_tokens_details.cached_tokens` on `response.completed`.
- computed: llama-server's `timings.prompt_n` where it sends timings (what it decoded),
  else prompt minus cached.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx

from bench.loadgen import sse_objects
from bench.replay_sessions import Request

# tool_choice "none" on each API: the same prompt without a call grammar.
NO_TOOLS = {"chat": "none", "messages": {"type": "none"}, "responses": "none"}


@dataclass
class Reply:
    """What one request cost: seconds to the first generated token and to the end, the
    prompt's tokens, those the server computed, the reply's; `error` when it failed."""

    ttft: float = 0.0
    total: float = 0.0
    prompt: int = 0
    computed: int = 0
    completion: int = 0
    error: str = ""


def generated(api: str, data: dict[str, Any]) -> bool:
    """Whether a stream event carries generated output."""
    kind = str(data.get("type", ""))
    if api == "chat":
        choices = data.get("choices") or []
        delta = (choices[0].get("delta") or {}) if choices else {}
        return any(delta.get(k) for k in ("content", "reasoning_content", "tool_calls"))
    if api == "messages":
        block = data.get("content_block") or {}
        return kind == "content_block_delta" or (
            kind == "content_block_start" and block.get("type") == "tool_use"
        )
    item = data.get("item") or {}
    return kind.endswith(".delta") or (
        kind == "response.output_item.added" and item.get("type") != "message"
    )


class Counts:
    """The token counts of one stream, read event by event."""

    def __init__(self, api: str) -> None:
        self.api = api
        self.usage: dict[str, Any] = {}
        self.timings: dict[str, Any] = {}
        self.error = ""

    def read(self, data: dict[str, Any]) -> None:
        if data.get("timings"):
            self.timings = data["timings"]
        kind = data.get("type")
        if kind in ("error", "response.failed") or "error" in data:
            self.error = str(data.get("error") or (data.get("response") or {}).get("error"))[:300]
        usage = data.get("usage")
        if self.api == "messages" and kind == "message_start":
            usage = data.get("message", {}).get("usage")
        elif self.api == "responses":
            usage = (data.get("response") or {}).get("usage")
        if usage:  # later events override only the keys they carry (Anthropic's delta)
            self.usage.update(usage)

    def into(self, reply: Reply) -> None:
        u = self.usage
        if self.api == "chat":
            prompt = int(u.get("prompt_tokens", 0))
            cached = int((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        elif self.api == "messages":
            cached = int(u.get("cache_read_input_tokens") or 0)
            prompt = (int(u.get("input_tokens", 0)) + cached
                      + int(u.get("cache_creation_input_tokens") or 0))  # fmt: skip
        else:
            prompt = int(u.get("input_tokens", 0))
            cached = int((u.get("input_tokens_details") or {}).get("cached_tokens") or 0)
        reply.prompt = prompt
        reply.computed = int(self.timings.get("prompt_n", prompt - cached))
        reply.completion = int(u.get("completion_tokens", u.get("output_tokens", 0)))
        reply.error = reply.error or self.error


async def send(client: httpx.AsyncClient, api: str, request: Request) -> Reply:
    """One streamed request; a refusal or a broken stream is recorded, not raised, so
    that one failing turn does not stop a run (its session stops there)."""
    reply = Reply()
    counts = Counts(api)
    started = time.perf_counter()
    try:
        async with client.stream("POST", request.path, json=request.body,
                                 headers=request.headers) as r:  # fmt: skip
            if r.status_code != 200:
                reply.error = f"HTTP {r.status_code}: {(await r.aread()).decode()[:300]}"
                return reply
            async for data in sse_objects(r):
                if not reply.ttft and generated(api, data):
                    reply.ttft = time.perf_counter() - started
                counts.read(data)
    except httpx.HTTPError as exc:
        reply.error = f"{type(exc).__name__}: {exc}"
    reply.total = time.perf_counter() - started
    # a reply that generated nothing visible (a call held back whole) counts to its end
    reply.ttft = reply.ttft or reply.total
    counts.into(reply)
    return reply
