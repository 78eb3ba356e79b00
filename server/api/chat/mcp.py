"""Chat Completions with `{"type": "mcp", ...}` tools (a kvserve extension: OpenAI defines
MCP tools for the Responses API only). The server runs the loop (server/mcp/loop.py);
`message` holds the answer (the text of every round, and the client's own calls, if
any), and the top-level `kvserve_mcp` field reports the servers' tool lists and every
call with its result. A stream sends the text as usual, and one chunk with no choices and
a `kvserve_mcp` field per listing and per finished call. There is no approval flow in
this API: `require_approval` may only be "never" (its default here).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from fastapi import Request

from server.api.chat.input import chat_message, chat_messages, chat_options, stream_deltas
from server.api.chat.protocol import ChatCompletionRequest
from server.errors import APIError, BadRequest, Unsupported
from server.http.deps import Caller, resolve_model
from server.mcp.loop import CallDone, Finished, LoopSpec, Output, RoundDone, run_loop
from server.mcp.refs import openai_ref
from server.mcp.toolset import McpRef, Toolset
from server.mcp.turn import check_mcp_choice, loop_prepare, loop_session, mcp_turn
from server.serving import sse
from server.serving.drive import new_id, now, until_disconnect
from server.serving.prepare import with_images
from server.serving.state import ParsedOutput, chat_finish_text


def _refs(body: ChatCompletionRequest) -> list[McpRef]:
    refs = []
    for i, tool in enumerate(body.tools or []):
        if tool.type != "mcp":
            continue
        raw = tool.model_dump(exclude_none=True)
        raw.pop("function", None)
        if raw.setdefault("require_approval", "never") != "never":
            raise Unsupported(
                f"tools[{i}].require_approval",
                "chat completions has no "
                "approval flow; only 'never' (use /v1/responses for approvals)",
            )
        refs.append(openai_ref(raw, f"tools[{i}]"))
    return refs


def listing(toolset: Toolset) -> list[dict[str, Any]]:
    return [{"server_label": s.ref.label, "tools": [t.name for t in s.tools], "error": s.error}
            for s in toolset.servers]  # fmt: skip


def call_report(event: CallDone) -> dict[str, Any]:
    c, o = event.call, event.outcome
    return {"id": c.id, "server_label": c.server_label, "name": c.name,
            "arguments": c.arguments, "output": o.output, "error": o.error}  # fmt: skip


async def serve_chat_mcp(body: ChatCompletionRequest, request: Request, caller: Caller) -> Any:
    body.log_unknown("chat.completions")
    if body.n != 1:
        raise BadRequest("with mcp tools 'n' must be 1", param="n")
    if body.logprobs:
        raise Unsupported("logprobs", "not with mcp tools")
    # Everything that can be refused without the MCP servers, before any is contacted.
    refs = _refs(body)
    served = resolve_model(request, body.model)
    engine = served.engine
    given = body.session_id or caller.session_header
    session_id, pool, internal = loop_session(given)
    sampling = replace(body.sampling_record(), session_id=session_id)
    max_tokens = body.max_completion_tokens or body.max_tokens
    messages, options = chat_messages(body), chat_options(body)
    messages = await with_images(request, engine.info, messages)
    prepare = loop_prepare(served, sampling, caller, pool, max_tokens=max_tokens,
                           overflow=served.context_overflow)  # fmt: skip
    response_id, created, model = new_id("chatcmpl"), now(), engine.info.model_id
    limits = request.app.state.settings.mcp
    async with mcp_turn(request, refs, caller, engine, session_id if internal else None) as turn:
        check_mcp_choice(body.tool_choice, turn.toolset)
        spec = LoopSpec(turn.toolset, messages, options, prepare, engine.generate, limits)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return turn.stream(_stream(spec, response_id, created, model, include_usage))
        return await until_disconnect(request, _complete(spec, response_id, created, model))


def _usage(event: Finished) -> dict[str, Any]:
    total = event.total
    return {"prompt_tokens": event.num_prompt_tokens,
            "completion_tokens": total.num_output_tokens,
            "total_tokens": event.num_prompt_tokens + total.num_output_tokens,
            "prompt_tokens_details": {"cached_tokens": total.num_cached_tokens}}  # fmt: skip


async def _complete(spec: LoopSpec, response_id: str, created: int, model: str) -> Any:
    output = ParsedOutput()
    report: list[dict[str, Any]] = []
    async for event in run_loop(spec):
        if isinstance(event, Output):
            output.add(event.deltas)
        elif isinstance(event, CallDone):
            report.append(call_report(event))
        elif isinstance(event, Finished):
            message = chat_message(output)
            finish = chat_finish_text(event.total.finish_reason, len(output.calls))
            return {
                "id": response_id, "object": "chat.completion", "created": created,
                "model": model, "system_fingerprint": None,
                "choices": [{"index": 0, "message": message, "logprobs": None,
                             "finish_reason": finish}],
                "usage": _usage(event),
                "kvserve_mcp": {"tools": listing(spec.toolset), "calls": report,
                                "rounds": event.rounds},
            }  # fmt: skip
    raise AssertionError("the loop ends with Finished")


async def _stream(spec: LoopSpec, response_id: str, created: int, model: str,
                  include_usage: bool) -> AsyncIterator[str]:  # fmt: skip
    head = {"id": response_id, "object": "chat.completion.chunk", "created": created,
            "model": model, "system_fingerprint": None}  # fmt: skip

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
        return json.dumps({**head, "choices": choices, **extra}, ensure_ascii=False)

    def part(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    yield chunk([part({"role": "assistant", "content": ""})])
    yield chunk([], kvserve_mcp={"tools": listing(spec.toolset)})
    num_calls = 0
    try:
        async for event in run_loop(spec):
            if isinstance(event, Output):
                for delta in stream_deltas(event.deltas):
                    num_calls += sum(1 for c in delta.get("tool_calls", []) if "id" in c)
                    yield chunk([part(delta)])
            elif isinstance(event, CallDone):
                yield chunk([], kvserve_mcp={"call": call_report(event)})
            elif isinstance(event, RoundDone):
                continue
            elif isinstance(event, Finished):
                yield chunk([part({}, chat_finish_text(event.total.finish_reason, num_calls))])
                if include_usage:
                    yield chunk([], usage=_usage(event))
    except APIError as err:
        yield sse.openai_error_tail(err)
        return
    yield sse.DONE
