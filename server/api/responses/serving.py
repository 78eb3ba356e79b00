"""OpenAI Responses API on the serving core: POST/GET/DELETE /v1/responses.

A turn is a chat request: `instructions` as the system turn, the stored conversation of
`previous_response_id`, then this `input`. A stored conversation runs on one kvserve
session (its slot keeps the KV), so the next turn prefills only what is new;
`usage.input_tokens_details.cached_tokens` reports what was reused.

A chain's session is minted here in a pool of its own (SessionPool.CHAIN), so stored
responses never use up or push out the sessions a client names; a turn that names a
session (X-Kvserve-Session, what a load balancer routes on) runs on that one instead.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any, NamedTuple

from fastapi import Request
from sse_starlette import ServerSentEvent

from chat.tools import Tool
from engine.client import (
    EngineLike,
    FinishReason,
    GenerateRequest,
    Generation,
    InvalidRequestError,
    SessionBusyError,
    SessionPool,
)
from server.api.responses.input import chat_param, input_messages, response_options
from server.api.responses.output import OutputBuilder, assistant_turn
from server.api.responses.protocol import ResponsesRequest
from server.api.responses.sealed import reasoning_seal
from server.api.responses.store import ResponseStore, Stored
from server.api.responses.tools import ToolNames, request_tools, response_tools
from server.errors import APIError, BadRequest, params_renamed
from server.http.deps import Caller, resolve_model
from server.models.served import ServedModel
from server.serving import sse
from server.serving.drive import collect, until_disconnect
from server.serving.events import named_events
from server.serving.prepare import Prepared, prepare_chat, with_images
from server.serving.replay import request_replay
from server.serving.state import Choice

log = logging.getLogger("kvserve.server")


def response_store(request: Request) -> ResponseStore:
    return request.app.state.responses  # type: ignore[no-any-return]


class Turn(NamedTuple):
    """What a turn starts from (with MCP tools or without)."""

    store: ResponseStore
    previous: Stored | None  # the stored response it continues
    served: ServedModel
    conversation: list[dict[str, Any]]  # the stored conversation, then this input
    names: ToolNames  # what the model's tool names stand for
    tools: tuple[Tool, ...]  # the tools the model sees (read once: hosted ones logged once)


async def open_turn(body: ResponsesRequest, request: Request, caller: Caller) -> Turn:
    store = response_store(request)
    previous = None
    if body.previous_response_id is not None:
        previous = await store.get(caller.tenant, body.previous_response_id,
                                   "previous_response_id")  # fmt: skip
    served = resolve_model(request, body.model)
    history = previous.conversation if previous else []
    tools, names = response_tools(request_tools(body.tools, body.input))
    # The app's seal, fetched only for an input that carries sealed reasoning.
    current = input_messages(
        body, lambda blob, param: reasoning_seal(request).open(blob, served.id, param), names
    )
    current = await with_images(request, served.engine.info, current)
    return Turn(store, previous, served, [*history, *current], names, tools)


def output_builder(body: ResponsesRequest, request: Request, turn: Turn) -> OutputBuilder:
    """The builder of this turn's items, with what the request asked of them."""
    seal = reasoning_seal(request)
    model = turn.served.id
    return OutputBuilder(
        turn.names,
        (lambda text: seal.seal(text, model)) if body.encrypted_reasoning else None,
        summary=body.reasoning is not None and body.reasoning.summary is not None,
    )


async def serve_response(body: ResponsesRequest, request: Request, caller: Caller) -> Any:
    body.log_unknown("responses")
    body.log_hints()
    turn = await open_turn(body, request, caller)
    store, previous, served, conversation, names, tools = turn
    engine = served.engine
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    session_id, pool = _session(body, caller, previous)
    with params_renamed(lambda param: chat_param(param, names.fields)):
        prepared = await prepare_chat(
            engine, served.template, [*system, *conversation], response_options(body, tools),
            replace(body.sampling_record(session_id), session_pool=pool), caller,
            max_tokens=body.max_output_tokens,
            replay=lambda: request_replay(request, served.id, caller),
        )  # fmt: skip
    generation, session_id = await _generate(engine, prepared.requests)
    response = _skeleton(body, engine.info.model_id)

    async def keep(final: dict[str, Any], builder: OutputBuilder) -> None:
        if body.store and final["status"] in ("completed", "incomplete"):
            reply = assistant_turn(builder.items, names)
            entry = Stored(caller.tenant, final, [*conversation, reply], session_id, pool)
            await store.put(entry)

    log.info("response %s: %d prompt tokens, stream=%s, previous=%s", response["id"],
             len(prepared.prompt), body.stream, body.previous_response_id)  # fmt: skip
    if body.stream:
        builder = output_builder(body, request, turn)
        events = _stream(engine, generation, prepared, response, keep, builder)
        return sse.event_stream(events, on_close=generation.abort)
    (choice,) = await until_disconnect(request, collect(generation, 1))
    builder = output_builder(body, request, turn)
    builder.feed(prepared.finish(0, choice).deltas)
    final = _finished(response, builder, choice, len(prepared.prompt))
    await keep(final, builder)
    return final


def _session(
    body: ResponsesRequest, caller: Caller, previous: Stored | None
) -> tuple[str | None, SessionPool]:
    """The session this turn runs on, and its pool: the one the client names, else the
    stored conversation's, else (to be stored) a new chain session."""
    if caller.session_header is not None:
        return caller.session_header, SessionPool.NAMED
    if previous is not None and previous.session_id is not None:
        return previous.session_id, previous.session_pool
    if body.store:
        return "resp_chain_" + secrets.token_hex(12), SessionPool.CHAIN
    return None, SessionPool.NAMED


async def _generate(
    engine: EngineLike, requests: list[GenerateRequest]
) -> tuple[Generation, str | None]:
    """Start on the conversation's session; if that session is busy (two turns continue
    one response at once) or none is free, run without one (the prefix cache still
    serves the shared head)."""
    try:
        try:
            return await engine.generate(requests), requests[0].session_id
        except SessionBusyError:
            if requests[0].session_id is None:
                raise
        return await engine.generate([replace(r, session_id=None) for r in requests]), None
    except InvalidRequestError as exc:  # the engine names chat's fields: name ours
        param = {"max_tokens": "max_output_tokens", "messages": "input"}.get(exc.param or "")
        raise BadRequest(exc.message, param=param or exc.param, code=exc.code) from exc


def _skeleton(body: ResponsesRequest, model: str) -> dict[str, Any]:
    fmt = body.text.format if body.text and body.text.format else None
    choice = body.tool_choice
    return {
        "id": "resp_" + secrets.token_hex(24),
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "metadata": body.metadata or {},
        "model": model,
        "output": [],
        "parallel_tool_calls": body.parallel_tool_calls,
        "previous_response_id": body.previous_response_id,
        "reasoning": {"effort": body.effort,
                      "summary": body.reasoning.summary if body.reasoning else None},
        "service_tier": "default",
        "store": body.store,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt
                 else {"type": "text"}},
        "tool_choice": "auto" if choice is None else choice if isinstance(choice, str)
        else choice.model_dump(),
        "tools": [_echo_tool(t) for t in body.tools or []],
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "truncation": "disabled",
        "usage": None,
        "user": body.user,
    }  # fmt: skip


def _echo_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool as the response lists it: a function with its defaults filled in, any other
    as sent (hosted ones included: the response says what was asked)."""
    if tool.get("type") != "function":
        return tool
    return {"type": "function", "name": tool.get("name"), "description": tool.get("description"),
            "parameters": tool.get("parameters"), "strict": tool.get("strict", True)}  # fmt: skip


def _finished(
    response: dict[str, Any],
    builder: OutputBuilder,
    total: Choice,
    num_prompt: int,
    error: APIError | None = None,
) -> dict[str, Any]:
    """The response once its generation ended (also the payload of the final event)."""
    if error is not None:
        status = "failed"
    elif total.finish_reason is FinishReason.LENGTH:
        status = "incomplete"
    else:
        status = "completed"
    builder.close("completed" if status == "completed" else "incomplete")
    output = total.num_output_tokens
    return {
        **response,
        "status": status,
        "error": None if error is None else {"code": "server_error", "message": error.message},
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "output": builder.items,
        "usage": {
            "input_tokens": num_prompt,
            "input_tokens_details": {"cached_tokens": total.num_cached_tokens},
            "output_tokens": output,
            # counted by the engine as generated (engine/thinking.py), tags included
            "output_tokens_details": {"reasoning_tokens": total.num_reasoning_tokens},
            "total_tokens": num_prompt + output,
        },
    }


async def _stream(
    engine: EngineLike,
    generation: Generation,
    prepared: Prepared,
    response: dict[str, Any],
    keep: Any,
    builder: OutputBuilder,
) -> AsyncIterator[ServerSentEvent]:
    """The documented event sequence, every event numbered by `sequence_number`; while
    the stream is silent (a long prefill), `response.in_progress` again every
    sse.HEARTBEAT_S (Codex drops a stream that sends no event for 300 s)."""
    numbers = itertools.count()

    def event(name: str, payload: dict[str, Any]) -> ServerSentEvent:
        return sse.named(name, {**payload, "sequence_number": next(numbers)})

    yield event("response.created", {"response": response})
    yield event("response.in_progress", {"response": response})
    (state,) = prepared.states()
    try:
        beat = ("response.in_progress", {"response": response})
        async for name, payload in named_events(generation, state, builder, beat):
            yield event(name, payload)
    except APIError as err:
        final = _finished(response, builder, state.total, len(prepared.prompt), err)
        for name, payload in builder.drain():
            yield event(name, payload)
        yield event("response.failed", {"response": final})
        return
    final = _finished(response, builder, state.total, len(prepared.prompt))
    for name, payload in builder.drain():
        yield event(name, payload)
    await keep(final, builder)
    done = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    yield event(done, {"response": final})


async def get_response(request: Request, caller: Caller, response_id: str) -> dict[str, Any]:
    return (await response_store(request).get(caller.tenant, response_id)).response


async def delete_response(request: Request, caller: Caller, response_id: str) -> dict[str, Any]:
    await response_store(request).delete(caller.tenant, response_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}
