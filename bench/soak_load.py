"""The soak's load: a few clients, each sending a mix of every API kvserve serves.

Used by bench/soak.py. Each client loops until the deadline, picking its next request
kind at random (seeded): chat completions (plain and streamed), turns of a chat on a
sticky session (X-Kvserve-Session; a session lasts a few turns and is then deleted or left
to expire), tool calls (tools + tool_choice "required", a grammar), embeddings,
Responses turns chained by previous_response_id (a chain's last stored response is
usually deleted), and Anthropic Messages (some with a required tool). Every request has a
small token bound and a client timeout, so the whole load ends soon after the deadline.

The prompts repeat on purpose: every chat-like request starts with one of a few long
system prompts (each several cache blocks), more heads than the server has slots, so a
repeated head is found in a slot, in the RAM tier or on disk (a small RAM tier, set by
soak.py, pushes older prefixes to disk).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

TOPICS = [
    "volcanoes", "the printing press", "bread baking", "chess openings", "bicycles",
    "tides", "honey bees", "rainbows", "the moon landing", "bird migration",
    "the water cycle", "vaccines", "the telephone", "glaciers", "lighthouses", "coral reefs",
    "windmills", "paper making", "the compass", "sourdough", "suspension bridges",
    "the abacus", "clocks", "solar eclipses",
]  # fmt: skip
QUESTIONS = [
    "Give me one surprising fact.", "Explain it to a child.", "What is the main idea?",
    "Name one common mistake.", "Summarise it in a sentence.", "Why does it matter?",
]  # fmt: skip
WEATHER_TOOL = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
}
CITIES = ["Oslo", "Lima", "Cairo", "Perth", "Quito", "Riga", "Hanoi", "Dakar"]


def system_prompt(topic: str) -> str:
    """A few hundred tokens, fixed per topic: a head the prefix cache stores and finds."""
    rules = (
        "Answer briefly and plainly. Use concrete examples. Avoid jargon, and define any "
        "term a newcomer would not know. Prefer short sentences over long ones. If a "
        "question is ambiguous, answer the most likely reading and say which one you chose. "
    )
    return f"You are a patient tutor on {topic}. " + rules * 6 + f"Stay on the topic of {topic}."


@dataclass
class Tally:
    """Requests answered by kind, failures by kind, and the first few failure texts."""

    sent: Counter[str] = field(default_factory=Counter)
    ok: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    samples: list[str] = field(default_factory=list)

    def fail(self, kind: str, text: str) -> None:
        self.failed[kind] += 1
        if len(self.samples) < 20:
            self.samples.append(f"{kind}: {text[:300]}")

    @property
    def num_ok(self) -> int:
        return sum(self.ok.values())

    @property
    def num_failed(self) -> int:
        return sum(self.failed.values())


class RequestFailed(Exception):
    pass


def stream_failure(line: str) -> str | None:
    """The error text of one SSE data line, if it reports one (any of the three APIs)."""
    if not line.startswith("data: ") or line == "data: [DONE]":
        return None
    data = json.loads(line[6:])
    if not isinstance(data, dict):
        return None
    if "error" in data or data.get("type") in ("error", "response.failed"):
        return line[:300]
    return None


class Client:
    """One client: its own random stream, at most one open session and one response chain."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        model: str,
        index: int,
        args: argparse.Namespace,
        tally: Tally,
    ):
        self.http, self.model, self.index, self.tally = http, model, index, tally
        self.rng = random.Random(args.seed * 1000 + index)
        self.topics = TOPICS[: args.topics]
        self.num_opened = 0
        self.session: tuple[str, list[dict[str, Any]], int] | None = None  # id, history, turns
        self.chain: tuple[str, str | None, int] | None = None  # topic, previous id, turns
        self.kinds = {
            "chat": (self.chat, 2),
            "chat_stream": (self.chat_stream, 2),
            "session_chat": (self.session_chat, 3),
            "tools": (self.tools, 1),
            "embeddings": (self.embeddings, 1),
            "responses": (self.responses, 2),
            "messages": (self.messages, 1),
        }

    async def run(self, deadline: float) -> None:
        """Every kind once (each client from a different one, so a short run covers them
        all), then kinds drawn at random by weight, until the deadline."""
        names = list(self.kinds)
        weights = [self.kinds[n][1] for n in names]
        first = self.index % len(names)
        order = iter(names[first:] + names[:first])
        while time.monotonic() < deadline:
            kind = next(order, None) or self.rng.choices(names, weights)[0]
            await self.attempt(kind, self.kinds[kind][0])

    async def attempt(self, kind: str, send: Any, *args: Any) -> Any:
        """One request of `kind`, counted; its result, or None when it failed."""
        self.tally.sent[kind] += 1
        try:
            result = await send(*args)
        except (httpx.HTTPError, RequestFailed, ValueError) as exc:
            self.tally.fail(kind, f"{type(exc).__name__}: {exc}")
            return None
        self.tally.ok[kind] += 1
        return result

    # -- plumbing -------------------------------------------------------------------------

    async def post(self, path: str, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
        r = await self.http.post(path, json=body, **kw)
        if r.status_code != 200:
            raise RequestFailed(f"{path} HTTP {r.status_code}: {r.text[:300]}")
        return r.json()  # type: ignore[no-any-return]

    async def stream(self, path: str, body: dict[str, Any], **kw: Any) -> list[dict[str, Any]]:
        """The stream's data objects; raises on a non-200 answer or an error event."""
        events: list[dict[str, Any]] = []
        async with self.http.stream("POST", path, json={**body, "stream": True}, **kw) as r:
            if r.status_code != 200:
                raise RequestFailed(f"{path} HTTP {r.status_code}: {(await r.aread())[:300]!r}")
            async for line in r.aiter_lines():
                if (failure := stream_failure(line)) is not None:
                    raise RequestFailed(f"{path} stream: {failure}")
                if line.startswith("data: {"):
                    events.append(json.loads(line[6:]))
        if not events:
            raise RequestFailed(f"{path} stream: no events")
        return events

    def head(self) -> tuple[str, str]:
        topic = self.rng.choice(self.topics)
        return topic, system_prompt(topic)

    def chat_body(self, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {"model": self.model, "messages": messages, "max_tokens": 16,
                "temperature": 0.7, "seed": self.rng.randrange(1 << 30), **extra}  # fmt: skip

    # -- request kinds ----------------------------------------------------------------------

    async def chat(self) -> None:
        _, system = self.head()
        messages = [{"role": "system", "content": system},
                    {"role": "user", "content": self.rng.choice(QUESTIONS)}]  # fmt: skip
        out = await self.post("/v1/chat/completions", self.chat_body(messages))
        if not out.get("choices"):
            raise RequestFailed("chat: no choices")

    async def chat_stream(self) -> None:
        _, system = self.head()
        messages = [{"role": "system", "content": system},
                    {"role": "user", "content": self.rng.choice(QUESTIONS)}]  # fmt: skip
        await self.stream("/v1/chat/completions", self.chat_body(messages))

    async def session_chat(self) -> None:
        """The next turn of this client's session; a new one if none is open. After its
        last turn a session is deleted (two times in three) or left to its TTL."""
        if self.session is None:
            self.num_opened += 1
            _, system = self.head()
            session_id = f"soak-{self.index}-{self.num_opened}-{self.rng.randrange(1 << 30):x}"
            self.session = (session_id, [{"role": "system", "content": system}],
                            self.rng.randint(2, 6))  # fmt: skip
        session_id, history, turns = self.session
        history.append({"role": "user", "content": self.rng.choice(QUESTIONS)})
        headers = {"X-Kvserve-Session": session_id}
        body = self.chat_body(history)
        if self.rng.random() < 0.5:
            events = await self.stream("/v1/chat/completions", body, headers=headers)
            text = "".join(
                (c.get("delta") or {}).get("content") or ""
                for e in events
                for c in e.get("choices") or []
            )
        else:
            out = await self.post("/v1/chat/completions", body, headers=headers)
            text = out["choices"][0]["message"].get("content") or ""
        history.append({"role": "assistant", "content": text})
        self.session = (session_id, history, turns - 1)
        if turns - 1 <= 0:
            self.session = None
            if self.rng.random() < 2 / 3:
                await self.attempt("session_delete", self.delete, f"/v1/sessions/{session_id}")

    async def delete(self, path: str) -> None:
        r = await self.http.delete(path)
        if r.status_code != 200:
            raise RequestFailed(f"DELETE {path} HTTP {r.status_code}: {r.text[:300]}")

    async def tools(self) -> None:
        tool = {"type": "function", "function": {"name": "get_weather",
                "description": "Weather in a city", "parameters": WEATHER_TOOL}}  # fmt: skip
        messages = [{"role": "user", "content": f"Weather in {self.rng.choice(CITIES)}?"}]
        body = self.chat_body(messages, tools=[tool], tool_choice="required", max_tokens=40,
                              parallel_tool_calls=False)  # fmt: skip
        if self.rng.random() < 0.5:
            await self.stream("/v1/chat/completions", body)
        else:
            out = await self.post("/v1/chat/completions", body)
            if not out.get("choices"):
                raise RequestFailed("tools: no choices")

    async def embeddings(self) -> None:
        inputs = [system_prompt(self.rng.choice(self.topics))[: self.rng.randrange(40, 1200)]
                  for _ in range(self.rng.randint(1, 4))]  # fmt: skip
        out = await self.post("/v1/embeddings", {"model": self.model, "input": inputs})
        if len(out.get("data") or []) != len(inputs):
            raise RequestFailed("embeddings: wrong number of vectors")

    async def responses(self) -> None:
        """The next turn of this client's stored-response chain (previous_response_id).
        After its last turn the chain's last response is deleted (two times in three)."""
        if self.chain is None:
            self.chain = (self.rng.choice(self.topics), None, self.rng.randint(2, 5))
        topic, previous, turns = self.chain
        body: dict[str, Any] = {
            "model": self.model, "instructions": system_prompt(topic),
            "input": self.rng.choice(QUESTIONS), "max_output_tokens": 16, "store": True,
            **({"previous_response_id": previous} if previous else {}),
        }  # fmt: skip
        if self.rng.random() < 0.5:
            events = await self.stream("/v1/responses", body)
            ids = [e["response"]["id"] for e in events if isinstance(e.get("response"), dict)]
            if not ids:
                raise RequestFailed("responses stream: no response id")
            response_id = ids[-1]
        else:
            response_id = (await self.post("/v1/responses", body))["id"]
        self.chain = (topic, response_id, turns - 1)
        if turns - 1 <= 0:
            self.chain = None
            if self.rng.random() < 2 / 3:
                await self.attempt("response_delete", self.delete, f"/v1/responses/{response_id}")

    async def messages(self) -> None:
        _, system = self.head()
        body: dict[str, Any] = {
            "model": self.model, "max_tokens": 16, "system": system, "temperature": 0.7,
            "messages": [{"role": "user", "content": self.rng.choice(QUESTIONS)}],
        }  # fmt: skip
        if self.rng.random() < 0.3:  # a required tool: a grammar on the Messages path
            body["tools"] = [{"name": "get_weather", "description": "Weather in a city",
                              "input_schema": WEATHER_TOOL}]  # fmt: skip
            body["tool_choice"] = {"type": "any", "disable_parallel_tool_use": True}
            body["max_tokens"] = 40
        if self.rng.random() < 0.5:
            await self.stream("/v1/messages", body)
        else:
            out = await self.post("/v1/messages", body)
            if out.get("type") != "message":
                raise RequestFailed(f"messages: {str(out)[:200]}")


async def run_clients(base_url: str, model: str, args: argparse.Namespace, tally: Tally) -> None:
    """`args.clients` clients sending requests for `args.minutes` (each then finishes the
    request in hand, bounded by `args.timeout`)."""
    deadline = time.monotonic() + args.minutes * 60
    limits = httpx.Limits(max_connections=args.clients * 2)
    async with httpx.AsyncClient(base_url=base_url, timeout=args.timeout, limits=limits) as http:
        clients = [Client(http, model, i, args, tally) for i in range(args.clients)]
        await asyncio.gather(*(c.run(deadline) for c in clients))
