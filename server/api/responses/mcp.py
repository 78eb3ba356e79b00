"""The Responses API with `{"type": "mcp"}` tools: the agentic loop (server/mcp/loop.py)
in OpenAI's shapes.

Output items, in order: one `mcp_list_tools` per server, then per round the text and one
`mcp_call` per call (`output`, or `error` and status `failed`), then the final message.
A call that needs approval (`require_approval`, OpenAI's default "always") ends the turn
with an `mcp_approval_request`; the next request (by `previous_response_id`, or with the
items sent back) carries `mcp_approval_response` items and the loop goes on from there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import Request
from sse_starlette import ServerSentEvent

from engine.client import GenerateRequest, Generation
from server.api.responses.input import chat_param, response_options
from server.api.responses.output import OutputBuilder, item_id
from server.api.responses.protocol import ResponsesRequest
from server.api.responses.serving import (
    _finished,
    _generate,
    _session,
    _skeleton,
    open_turn,
)
from server.api.responses.store import Stored
from server.errors import APIError, BadRequest
from server.http.deps import Caller, EngineLike
from server.mcp.loop import (
    ApprovalNeeded,
    CallDone,
    CallStarted,
    Finished,
    Generate,
    LoopEvent,
    LoopSpec,
    McpCall,
    Output,
    run_loop,
)  # fmt: skip
from server.mcp.refs import openai_ref
from server.mcp.toolset import Toolset
from server.mcp.turn import check_mcp_choice, loop_prepare, loop_session, mcp_turn
from server.serving import sse
from server.serving.drive import until_disconnect
from server.serving.state import Choice


def _approvals(body: ResponsesRequest, earlier: list[dict[str, Any]],
               toolset: Toolset) -> list[tuple[McpCall, bool]]:  # fmt: skip
    """The `mcp_approval_response` items, each matched to the request it answers."""
    items = body.input if isinstance(body.input, list) else []
    asked = {i.get("id"): i for i in [*earlier, *items] if i.get("type") == "mcp_approval_request"}
    out = []
    for n, item in enumerate(items):
        if item.get("type") != "mcp_approval_response":
            continue
        where = f"input[{n}]"
        request = asked.get(item.get("approval_request_id"))
        if request is None:
            raise BadRequest(
                f"'{where}.approval_request_id' names no mcp_approval_request of this conversation",
                param=f"{where}.approval_request_id",
            )
        if not isinstance(item.get("approve"), bool):
            raise BadRequest(f"'{where}.approve' must be a boolean", param=f"{where}.approve")
        server = toolset.server(request.get("server_label", ""))
        if server is None or toolset.owner(request.get("name", "")) is not server:
            raise BadRequest(
                f"'{where}': the mcp tool of server '{request.get('server_label')}' "
                "must be in 'tools' to run the approved call",
                param="tools",
            )
        call = McpCall(item_id("mcp"), request["id"], server.ref.label, request["name"],
                       request.get("arguments", "{}"))  # fmt: skip
        out.append((call, item["approve"]))
    return out


def _echo_tools(body: ResponsesRequest, response: dict[str, Any]) -> None:
    """The response's `tools`: the mcp entries as sent, their secrets left out."""
    for i, tool in enumerate(body.tools or []):
        if tool.get("type") == "mcp":
            response["tools"][i] = {k: v for k, v in tool.items()
                                    if k not in ("headers", "authorization")}  # fmt: skip


async def serve_mcp_response(body: ResponsesRequest, request: Request, caller: Caller) -> Any:
    body.log_unknown("responses")
    body.log_hints()
    store, previous, served, conversation, _, tools = await open_turn(body, request, caller)
    engine = served.engine
    # Everything that can be refused without the MCP servers, before any is contacted.
    options = response_options(body, tools)
    refs = [openai_ref(t, f"tools[{i}]") for i, t in enumerate(body.tools or [])
            if t.get("type") == "mcp"]  # fmt: skip
    given, pool = _session(body, caller, previous)
    session_id, loop_pool, internal = loop_session(given)
    pool = loop_pool if internal else pool
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    sampling = body.sampling_record(session_id)
    prepare = loop_prepare(served, sampling, caller, pool, max_tokens=body.max_output_tokens,
                           head=system, param_name=chat_param)  # fmt: skip
    response = _skeleton(body, engine.info.model_id)
    _echo_tools(body, response)
    kept_session = None if internal else session_id

    async def keep(final: dict[str, Any], turns: list[dict[str, Any]]) -> None:
        if body.store and final["status"] in ("completed", "incomplete"):
            await store.put(Stored(caller.tenant, final, turns, kept_session, pool))

    async with mcp_turn(request, refs, caller, engine, session_id if internal else None) as turn:
        check_mcp_choice(body.tool_choice, turn.toolset)
        earlier = previous.response["output"] if previous else []
        resumed = _approvals(body, earlier, turn.toolset)
        spec = LoopSpec(turn.toolset, conversation, options, prepare, _first(engine),
                        request.app.state.settings.mcp, resumed)  # fmt: skip
        events = _events(spec, response, keep)
        if body.stream:
            return turn.stream(_numbered(response, events(True)))
        _, payload = await until_disconnect(request, _last(events(False)))
        return payload["response"]


def _first(engine: EngineLike) -> Generate:
    """The loop's generate: the conversation's session, else a fresh one if it is busy."""

    async def generate(requests: list[GenerateRequest]) -> Generation:
        return (await _generate(engine, requests))[0]

    return generate


Keep = Callable[[dict[str, Any], list[dict[str, Any]]], Awaitable[None]]


def _events(
    spec: LoopSpec, response: dict[str, Any], keep: Keep
) -> Callable[[bool], AsyncIterator[Event]]:
    """The response's events, for a stream (a failure is its last event) or not (raised);
    `keep` stores the final response with its conversation."""
    builder = OutputBuilder()
    resumed, toolset = spec.resumed, spec.toolset

    async def run(fail_in_stream: bool) -> AsyncIterator[Event]:
        """The response's events; the last one carries the final response."""
        _listed(builder, toolset)
        for item in builder.drain():
            yield item
        approved = {call.call_id for call, ok in resumed if ok}
        try:
            async for event in run_loop(spec):
                if isinstance(event, Finished):
                    final = _finished(response, builder, event.total,
                                      event.num_prompt_tokens)  # fmt: skip
                    await keep(final, [*event.messages,
                                       *([event.final_turn] if event.final_turn else [])])
                    for item in builder.drain():
                        yield item
                    done = ("response.incomplete" if final["status"] == "incomplete"
                            else "response.completed")  # fmt: skip
                    yield done, {"response": final}
                    return
                _apply(builder, event, approved)
                for item in builder.drain():
                    yield item
        except APIError as err:
            if not fail_in_stream:
                raise
            final = _finished(response, builder, Choice(), 0, err)
            for item in builder.drain():
                yield item
            yield "response.failed", {"response": final}

    return run


Event = tuple[str, dict[str, Any]]


async def _last(events: AsyncIterator[Event]) -> Event:
    last: Event = ("", {})
    async for event in events:
        last = event
    return last


async def _numbered(response: dict[str, Any],
                    events: AsyncIterator[Event]) -> AsyncIterator[ServerSentEvent]:  # fmt: skip
    number = 0
    for name, payload in [("response.created", {"response": response}),
                          ("response.in_progress", {"response": response})]:  # fmt: skip
        yield sse.named(name, {**payload, "sequence_number": number})
        number += 1
    async for name, payload in events:
        yield sse.named(name, {**payload, "sequence_number": number})
        number += 1


def _listed(builder: OutputBuilder, toolset: Toolset) -> None:
    """One `mcp_list_tools` item per server (with `error` when it could not be listed)."""
    for server in toolset.servers:
        tools = [{"name": t.name, "description": t.description, "input_schema": t.input_schema,
                  "annotations": None} for t in server.tools]  # fmt: skip
        item: dict[str, Any] = {"id": item_id("mcpl"), "type": "mcp_list_tools",
                                "server_label": server.ref.label, "tools": tools}  # fmt: skip
        if server.error is not None:
            item["error"] = server.error
        builder.open_item(item)
        builder.emit("response.mcp_list_tools.in_progress")
        ended = "failed" if server.error is not None else "completed"
        builder.emit(f"response.mcp_list_tools.{ended}")
        builder.done_item()


def _apply(builder: OutputBuilder, event: LoopEvent, approved: set[str]) -> None:
    if isinstance(event, Output):
        builder.feed(event.deltas)
    elif isinstance(event, CallStarted):
        call = event.call
        item: dict[str, Any] = {
            "id": call.id,
            "type": "mcp_call",
            "server_label": call.server_label,
            "name": call.name,
            "arguments": "",
            "status": "in_progress",
            "output": None,
            "error": None,
        }
        if call.call_id in approved:
            item["approval_request_id"] = call.call_id
        builder.open_item(item)
        builder.emit("response.mcp_call_arguments.delta", delta=call.arguments)
        item["arguments"] = call.arguments
        builder.emit("response.mcp_call_arguments.done", arguments=call.arguments)
        builder.emit("response.mcp_call.in_progress")
    elif isinstance(event, CallDone):
        item = builder.items[-1]
        if event.outcome.error is None:
            item.update(status="completed", output=event.outcome.output)
            builder.emit("response.mcp_call.completed")
        else:
            item.update(status="failed", error=_error(event.outcome.error))
            builder.emit("response.mcp_call.failed")
        builder.done_item()
    elif isinstance(event, ApprovalNeeded):
        call = event.call
        builder.open_item({"id": call.call_id, "type": "mcp_approval_request",
                           "server_label": call.server_label, "name": call.name,
                           "arguments": call.arguments})  # fmt: skip
        builder.done_item()


def _error(message: str) -> dict[str, Any]:
    """An `mcp_call` error in openai-python's McpToolCallError shape."""
    return {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": message}]}
