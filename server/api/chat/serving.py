"""OpenAI Chat Completions on the serving core: the response object and its stream."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request, Response

from engine.client import EngineLike, Generation, TokenLogprob
from server.api.chat.input import chat_message, chat_messages, chat_options, stream_deltas
from server.api.chat.protocol import ChatCompletionRequest
from server.errors import APIError
from server.http.deps import Caller, resolve_model
from server.serving import sse
from server.serving.drive import (
    check_n,
    collect,
    new_id,
    now,
    steps,
    until_disconnect,
)
from server.serving.prepare import DROPPED_HEADER, Prepared, prepare_chat, with_images
from server.serving.replay import request_replay
from server.serving.state import Choice, chat_finish_text, parsed, usage
from server.serving.timings import timings, with_timings
from server.serving.wire import TextLane, Wire

log = logging.getLogger("kvserve.server")


def logprob_entry(engine: EngineLike, lp: TokenLogprob) -> dict[str, Any]:
    def one(token: int, logprob: float) -> dict[str, Any]:
        raw = engine.token_bytes(token)
        return {"token": raw.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(raw)}

    entry = one(lp.token_id, lp.logprob)
    entry["top_logprobs"] = [one(t.token_id, t.logprob) for t in lp.top]
    return entry


def _logprobs(engine: EngineLike, lps: list[TokenLogprob]) -> dict[str, Any]:
    return {"content": [logprob_entry(engine, lp) for lp in lps], "refusal": None}


async def serve_chat(
    body: ChatCompletionRequest, request: Request, response: Response, caller: Caller
) -> Any:
    body.log_unknown("chat.completions")
    served = resolve_model(request, body.model)
    engine = served.engine
    check_n(body.n, engine.info.n_seq_max)
    messages = await with_images(request, engine.info, chat_messages(body))
    prepared = await prepare_chat(
        engine,
        served.template,
        messages,
        chat_options(body),
        body.sampling_record(),
        caller,
        max_tokens=body.max_completion_tokens or body.max_tokens,
        logprobs=(body.top_logprobs or 0) if body.logprobs else None,
        overflow=served.context_overflow,
        replay=lambda: request_replay(request, served.id, caller),
        thinking_budget=body.thinking_budget,
    )
    generation = await engine.generate(prepared.requests)
    response_id, created = new_id("chatcmpl"), now()
    log.info(
        "chat.completion %s: %d prompt tokens, n=%d, stream=%s, user=%s",
        response_id, len(prepared.prompt), body.n, body.stream, body.user,
    )  # fmt: skip
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        framing = sse.chunk_framing("chat.completion.chunk", response_id, created,
                                    engine.info.model_id, include_usage)  # fmt: skip
        # A plain text stream of one choice: its tokens may skip the event loop (wire.py).
        wire = Wire() if body.n == 1 and prepared.plain_text and not body.return_tokens else None
        events = _stream(engine, generation, prepared, framing, include_usage,
                         body.return_tokens, body.timings_per_token, wire)  # fmt: skip
        stream = sse.event_stream(events, on_close=generation.abort, wire=wire)
        stream.headers[DROPPED_HEADER] = str(prepared.dropped)
        return stream
    response.headers[DROPPED_HEADER] = str(prepared.dropped)
    choices = await until_disconnect(request, collect(generation, body.n))
    reply = {
        "id": response_id,
        "object": "chat.completion",
        "created": created,
        "model": engine.info.model_id,
        "system_fingerprint": None,
        "choices": [
            _choice(engine, prepared, i, c, body.logprobs, body.return_tokens)
            for i, c in enumerate(choices)
        ],
        "usage": usage(choices, len(prepared.prompt)),
    }
    if body.timings_per_token:  # llama-server's (server/serving/timings.py)
        reply["timings"] = timings(choices, len(prepared.prompt))
    return reply


def _choice(
    engine: EngineLike,
    prepared: Prepared,
    index: int,
    choice: Choice,
    logprobs: bool,
    return_tokens: bool,
) -> dict[str, Any]:
    msg = chat_message(parsed(prepared.finish(index, choice).deltas))
    out = {
        "index": index,
        "message": msg,
        "logprobs": _logprobs(engine, choice.logprobs) if logprobs else None,
        "finish_reason": chat_finish_text(choice.finish_reason, len(msg.get("tool_calls", []))),
    }
    if return_tokens:  # llama-server's: the ids sampled
        out["tokens"] = choice.token_ids
    return out


async def _stream(
    engine: EngineLike,
    generation: Generation,
    prepared: Prepared,
    framing: tuple[str, str],
    include_usage: bool,
    return_tokens: bool = False,
    timed: bool = False,
    wire: Wire | None = None,
) -> AsyncIterator[str]:
    """Text and call deltas, then each choice's finish_reason in a chunk of its own with
    an empty delta (as OpenAI sends it: a client that stops reading at the finish has
    everything by then), then the usage chunk and [DONE]. `framing`: the JSON around
    every chunk's choices (sse.chunk_framing). `return_tokens`: each increment's part
    carries its token ids; `timed`: the last chunk carries `timings` (llama-server's).
    `wire`: once the first token is out, the engine thread writes the chunk of each
    plain-text token itself, through a lane on it (server/serving/wire.py)."""
    head, tail = framing

    def chunk(choices: list[dict[str, Any]]) -> str:
        return head + json.dumps(choices, ensure_ascii=False) + tail

    def part(index: int, delta: dict[str, Any], lps: Any = None, finish: Any = None) -> Any:
        return {"index": index, "delta": delta, "logprobs": lps, "finish_reason": finish}

    def text_event(text: str) -> bytes:  # the chunk of plain text (the lane's)
        return sse.encode(chunk([part(0, {"content": text})]))

    def last_timings() -> dict[str, Any] | None:
        totals = [s.total for s in states]
        done = all(t.finish_reason is not None for t in totals)
        return timings(totals, len(prepared.prompt)) if timed and done else None

    states = prepared.states()
    yield chunk([part(s.index, {"role": "assistant", "content": ""}) for s in states])
    try:
        async for increment in steps(generation, states, sse.HEARTBEAT_S):
            if not increment:  # the heartbeat: a chunk every client reads as nothing new
                yield chunk([part(0, {})])
                continue
            parts: list[dict[str, Any]] = []
            finals: list[dict[str, Any]] = []
            for step in increment:
                if step.written:  # the lane sent it
                    continue
                if wire is not None and step.token_ids and wire.bound:
                    generation.open_lane(TextLane(wire, text_event))
                    wire = None
                deltas = stream_deltas(step.deltas)
                lps = _logprobs(engine, step.logprobs) if step.logprobs else None
                tokens = step.token_ids if return_tokens else []
                if (lps is not None or tokens) and not deltas:
                    deltas = [{}]
                for extra in deltas[:-1]:  # a call's opening chunk goes on its own
                    yield chunk([*parts, part(step.index, extra)])
                    parts = []
                if deltas:
                    parts.append(part(step.index, deltas[-1], lps))
                    if return_tokens:
                        parts[-1]["tokens"] = tokens
                finish = chat_finish_text(step.finish, step.num_calls)
                if finish is not None:
                    finals.append(part(step.index, {}, None, finish))
            if parts:
                yield chunk(parts)
            if finals:
                yield with_timings(chunk(finals), None if include_usage else last_timings())
    except APIError as err:
        yield sse.openai_error_tail(err)
        return
    if include_usage:
        totals = [s.total for s in states]
        last = head + '[],"usage":' + json.dumps(usage(totals, len(prepared.prompt))) + "}"
        yield with_timings(last, last_timings())
    yield sse.DONE
