"""Anthropic Messages API on the serving core: POST /v1/messages and count_tokens.

Usage follows Anthropic's accounting: `input_tokens` are the prompt tokens prefilled
for this request, `cache_read_input_tokens` those whose KV was reused (a session or
the prefix cache), so their sum is the prompt's length; `cache_creation_input_tokens`
is 0 (kvserve caches every prefix by itself, nothing is written on request).
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from sse_starlette import ServerSentEvent

from chat.callstream import Delta
from engine.client import FinishReason, Generation
from server.api.messages.input import chat_messages, message_options, param_names
from server.api.messages.protocol import CountTokensRequest, MessagesRequest
from server.errors import APIError, params_renamed
from server.http.deps import Caller, resolve_model
from server.serving import sse
from server.serving.drive import collect, steps, until_disconnect
from server.serving.events import NamedEvent
from server.serving.prepare import Prepared, make_plan, prepare_chat, prompt_tokens, with_images
from server.serving.replay import request_replay
from server.serving.state import Choice, ParsedOutput, coalesced

log = logging.getLogger("kvserve.server")


def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def toolu_id(call_id: str) -> str:
    """A parsed call's id as a tool_use block's (server/serving/replay.py keys by it)."""
    return "toolu_" + call_id.removeprefix("call_")


async def count_tokens(body: CountTokensRequest, request: Request) -> dict[str, Any]:
    """The prompt's length, rendered exactly as /v1/messages would render it."""
    body.log_unknown("messages.count_tokens")
    served = resolve_model(request, body.model)
    info = served.engine.info
    messages = await with_images(request, info, chat_messages(body))
    with params_renamed(param_names(body)):
        plan = make_plan(served.template, messages, message_options(body),
                         media_marker=info.media_marker)  # fmt: skip
        return {"input_tokens": len(await prompt_tokens(served.engine, plan))}


async def serve_messages(body: MessagesRequest, request: Request, caller: Caller) -> Any:
    body.log_unknown("messages")
    served = resolve_model(request, body.model)
    engine = served.engine
    sampling = body.sampling_record(session_id=None)
    messages = await with_images(request, engine.info, chat_messages(body))
    with params_renamed(param_names(body)):
        prepared = await prepare_chat(engine, served.template, messages,
                                      message_options(body), sampling, caller,
                                      max_tokens=body.max_tokens,
                                      replay=lambda: request_replay(request, served.id, caller,
                                                                    id_of=toolu_id),
                                      thinking_budget=body.thinking_budget)  # fmt: skip
    generation = await engine.generate(prepared.requests)
    message: dict[str, Any] = {
        "id": _id("msg"), "type": "message", "role": "assistant", "content": [],
        "model": engine.info.model_id, "stop_reason": None, "stop_sequence": None,
        "usage": _usage(len(prepared.prompt), Choice()),
    }  # fmt: skip
    log.info("message %s: %d prompt tokens, stream=%s", message["id"], len(prepared.prompt),
             body.stream)  # fmt: skip
    if body.stream:
        return sse.event_stream(_stream(generation, prepared, message,
                                        Blocks(omit_thinking=body.omits_thinking)),
                                on_close=generation.abort)  # fmt: skip
    (choice,) = await until_disconnect(request, collect(generation, 1))
    step = prepared.finish(0, choice)
    blocks = Blocks(omit_thinking=body.omits_thinking)
    blocks.feed(step.deltas)
    blocks.close()
    return {**message, "content": blocks.blocks, **_stop(choice, step.num_calls),
            "usage": _usage(len(prepared.prompt), choice)}  # fmt: skip


def _usage(num_prompt: int, total: Choice) -> dict[str, Any]:
    cached = min(total.num_cached_tokens, num_prompt)
    return {"input_tokens": num_prompt - cached, "output_tokens": total.num_output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}  # fmt: skip


def _stop(total: Choice, num_calls: int) -> dict[str, Any]:
    if total.finish_reason is FinishReason.LENGTH:
        return {"stop_reason": "max_tokens", "stop_sequence": None}
    if total.stop_sequence:
        return {"stop_reason": "stop_sequence", "stop_sequence": total.stop_sequence}
    return {"stop_reason": "tool_use" if num_calls else "end_turn", "stop_sequence": None}


class Blocks:
    """Parsed output -> content blocks and the stream events that build them; block
    indexes increase monotonically, one block open at a time.

    `omit_thinking` (`thinking.display: "omitted"`): a thinking block is still opened
    where the model thinks, but its `thinking` text stays empty and no thinking_delta is
    sent, as Anthropic does. Its `signature` is empty either way: thinking blocks sent
    back are dropped (input.py), so there is nothing for one to carry."""

    def __init__(self, *, omit_thinking: bool = False) -> None:
        self.omit_thinking = omit_thinking
        self.blocks: list[dict[str, Any]] = []
        self.events: list[NamedEvent] = []
        self._open: str | None = None  # the kind of the open block
        self._output = ParsedOutput()  # where an open tool_use block reads its input
        self._call = 0  # the open tool_use block's call

    def feed(self, deltas: list[Delta]) -> None:
        self._output.add(deltas)
        for d in coalesced(deltas):
            if d.kind == "start":
                self._call = d.index
                self._begin("tool_use", {"type": "tool_use", "id": toolu_id(d.call_id),
                                         "name": d.text, "input": {}})  # fmt: skip
            elif d.kind == "args":
                self._delta({"type": "input_json_delta", "partial_json": d.text})
            elif d.text and d.kind == "content":
                if self._open != "text":
                    self._begin("text", {"type": "text", "text": ""})
                self.blocks[-1]["text"] += d.text
                self._delta({"type": "text_delta", "text": d.text})
            elif d.text and d.kind == "reasoning":
                if self._open != "thinking":
                    self._begin("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                if not self.omit_thinking:
                    self.blocks[-1]["thinking"] += d.text
                    self._delta({"type": "thinking_delta", "thinking": d.text})

    def close(self) -> None:
        if self._open is None:
            return
        if self._open == "tool_use":
            args = self._output.call(self._call).arguments
            self.blocks[-1]["input"] = json.loads(args) if args.strip() else {}
        self.events.append(("content_block_stop", {"index": len(self.blocks) - 1}))
        self._open = None

    def server_block(self, block: dict[str, Any], partial_json: str | None = None) -> None:
        """A block the server made whole (MCP tool use and result): start, the input as
        one `input_json_delta` when given, stop."""
        self.close()
        self.blocks.append(block)
        start = {**block, "input": {}} if partial_json is not None else dict(block)
        self.events.append(("content_block_start",
                            {"index": len(self.blocks) - 1, "content_block": start}))  # fmt: skip
        if partial_json is not None:
            self._delta({"type": "input_json_delta", "partial_json": partial_json})
        self.events.append(("content_block_stop", {"index": len(self.blocks) - 1}))

    def drain(self) -> list[NamedEvent]:
        events, self.events = self.events, []
        return events

    def _begin(self, kind: str, block: dict[str, Any]) -> None:
        self.close()
        self.blocks.append(block)
        self._open = kind
        start = {**block, "input": {}} if kind == "tool_use" else dict(block)
        self.events.append(("content_block_start",
                            {"index": len(self.blocks) - 1, "content_block": start}))  # fmt: skip

    def _delta(self, delta: dict[str, Any]) -> None:
        self.events.append(("content_block_delta",
                            {"index": len(self.blocks) - 1, "delta": delta}))  # fmt: skip


async def _stream(
    generation: Generation, prepared: Prepared, message: dict[str, Any], blocks: Blocks
) -> AsyncIterator[ServerSentEvent]:
    """message_start waits for the engine to place the request, so that its usage
    carries the cache split (clients show it at once); until then, and whenever the
    stream is silent for sse.HEARTBEAT_S, a `ping` keeps the client's watchdog fed."""
    (state,) = prepared.states()
    started = False

    def start() -> list[ServerSentEvent]:
        usage = _usage(len(prepared.prompt), state.total)
        return [sse.named("message_start", {"message": {**message, "usage": usage}}),
                sse.named("ping", {})]  # fmt: skip

    try:
        async for increment in steps(generation, [state], sse.HEARTBEAT_S):
            if not increment:
                yield sse.named("ping", {})
                continue
            if not started:
                started = True
                for event in start():
                    yield event
            for step in increment:
                blocks.feed(step.deltas)
            for name, payload in blocks.drain():
                yield sse.named(name, payload)
    except APIError as err:
        if not started:
            for event in start():
                yield event
        yield sse.anthropic_error_tail(err)
        return
    blocks.close()
    for name, payload in blocks.drain():
        yield sse.named(name, payload)
    total = state.total
    yield sse.named("message_delta", {"delta": _stop(total, state.parser.num_calls),
                                      "usage": _usage(len(prepared.prompt), total)})  # fmt: skip
    yield sse.named("message_stop", {})
