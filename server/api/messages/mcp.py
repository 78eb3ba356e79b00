"""Anthropic's MCP connector on the Messages API (`anthropic-beta: mcp-client-2025-04-04`):
`mcp_servers: [{"type": "url", "url", "name", "authorization_token",
"tool_configuration": {"enabled", "allowed_tools"}}]`, each matched to a configured
server by its URL. The server runs the loop (server/mcp/loop.py); each call becomes an
`mcp_tool_use` block and its result an `mcp_tool_result` block, in the content before
the answer, streamed as whole blocks (start, the input as one `input_json_delta`, stop).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from sse_starlette import ServerSentEvent

from server.api.messages.input import chat_messages, message_options, param_names
from server.api.messages.protocol import MCP_BETA, MessagesRequest, betas
from server.api.messages.serving import Blocks, _stop, _usage
from server.errors import APIError, BadRequest
from server.http.deps import Caller, resolve_model
from server.mcp.loop import CallDone, CallStarted, Finished, LoopEvent, LoopSpec, Output, run_loop
from server.mcp.refs import anthropic_ref
from server.mcp.turn import loop_prepare, loop_session, mcp_turn
from server.serving import sse
from server.serving.drive import until_disconnect
from server.serving.prepare import with_images
from server.serving.state import Choice


async def serve_messages_mcp(body: MessagesRequest, request: Request, caller: Caller) -> Any:
    servers = (body.model_extra or {}).pop("mcp_servers")
    if MCP_BETA not in betas(request.headers.get("anthropic-beta", "")):
        raise BadRequest(f"mcp_servers needs the header 'anthropic-beta: {MCP_BETA}'",
                         param="mcp_servers")  # fmt: skip
    if not isinstance(servers, list):
        raise BadRequest("'mcp_servers' must be a list", param="mcp_servers")
    body.log_unknown("messages")
    # Everything that can be refused without the MCP servers, before any is contacted.
    refs = [anthropic_ref(s, f"mcp_servers[{i}]") for i, s in enumerate(servers)]
    served = resolve_model(request, body.model)
    engine = served.engine
    session_id, pool, internal = loop_session(caller.session_header)
    sampling = body.sampling_record(session_id)
    messages = await with_images(request, engine.info, chat_messages(body))
    options = message_options(body)
    prepare = loop_prepare(served, sampling, caller, pool, max_tokens=body.max_tokens,
                           param_name=param_names(body))  # fmt: skip
    message: dict[str, Any] = {
        "id": "msg_" + secrets.token_hex(12), "type": "message", "role": "assistant",
        "content": [], "model": engine.info.model_id, "stop_reason": None,
        "stop_sequence": None, "usage": _usage(0, Choice()),
    }  # fmt: skip
    limits = request.app.state.settings.mcp
    blocks = Blocks(omit_thinking=body.omits_thinking)
    async with mcp_turn(request, refs, caller, engine, session_id if internal else None) as turn:
        spec = LoopSpec(turn.toolset, messages, options, prepare, engine.generate, limits)
        if body.stream:
            return turn.stream(_stream(spec, message, blocks))
        return await until_disconnect(request, _complete(spec, message, blocks))


def _apply(blocks: Blocks, event: LoopEvent, num_calls: list[int]) -> None:
    if isinstance(event, Output):
        num_calls[0] += sum(1 for d in event.deltas if d.kind == "start")
        blocks.feed(event.deltas)
    elif isinstance(event, CallStarted):
        call = event.call
        try:
            arguments = json.loads(call.arguments or "{}")
        except json.JSONDecodeError:
            arguments = {}
        blocks.server_block({"type": "mcp_tool_use", "id": "mcptoolu_" + call.id[4:],
                             "name": call.name, "server_name": call.server_label,
                             "input": arguments}, call.arguments or "{}")  # fmt: skip
    elif isinstance(event, CallDone):
        outcome = event.outcome
        text = outcome.output if outcome.error is None else outcome.error
        blocks.server_block({"type": "mcp_tool_result",
                             "tool_use_id": "mcptoolu_" + event.call.id[4:],
                             "is_error": outcome.error is not None,
                             "content": [{"type": "text", "text": text or ""}]})  # fmt: skip


def _end(event: Finished, num_calls: int) -> dict[str, Any]:
    return {**_stop(event.total, num_calls),
            "usage": _usage(event.num_prompt_tokens, event.total)}  # fmt: skip


async def _complete(spec: LoopSpec, message: dict[str, Any], blocks: Blocks) -> dict[str, Any]:
    num_calls = [0]
    async for event in run_loop(spec):
        if isinstance(event, Finished):
            blocks.close()
            return {**message, "content": blocks.blocks, **_end(event, num_calls[0])}
        _apply(blocks, event, num_calls)
    raise AssertionError("the loop ends with Finished")


async def _stream(
    spec: LoopSpec, message: dict[str, Any], blocks: Blocks
) -> AsyncIterator[ServerSentEvent]:
    yield sse.named("message_start", {"message": message})
    yield sse.named("ping", {})
    num_calls = [0]
    try:
        async for event in run_loop(spec):
            if isinstance(event, Finished):
                blocks.close()
                for name, payload in blocks.drain():
                    yield sse.named(name, payload)
                end = _end(event, num_calls[0])
                usage = end.pop("usage")
                yield sse.named("message_delta", {"delta": end, "usage": usage})
                yield sse.named("message_stop", {})
                return
            _apply(blocks, event, num_calls)
            for name, payload in blocks.drain():
                yield sse.named(name, payload)
    except APIError as err:
        yield sse.anthropic_error_tail(err)
