"""The agentic loop: generate, call the MCP tools the model asked for, fold the results
back, generate again, until the model answers (or the iterations run out).

Bounds per request (`[mcp]`): `max_tool_iterations` rounds may call tools; each round
runs at most `max_calls_per_round` calls; the calls end by `max_loop_s` after the loop
starts (a call still running then is cut). A call past a bound is not run: it comes
back to the model as an error result, as a failed call does, and once the rounds or the
time are spent the next round is the last, in which the grammar allows no MCP call: the
model answers with what it has.

Every round runs on one kvserve session, so round N+1's prompt (round N's prompt, its
output and the tool results) continues on round N's KV: only the tool results and the
re-rendered call are prefilled. The prompt head stays the same over the rounds (the
tools are described with `auto` every round; a forced first call and a last round with
no calls are enforced by the grammar alone), or nothing would be reused.

API adapters read the loop as a stream of events and turn them into their own shapes.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from chat.callstream import Delta
from chat.plan import ChatOptions
from chat.tools import Tool, ToolChoice
from engine.client import FinishReason, GenerateRequest, Generation
from server.config.mcp import McpSection
from server.mcp.outcome import CallOutcome
from server.mcp.toolset import Toolset
from server.serving.drive import steps
from server.serving.prepare import Prepared
from server.serving.state import Choice, ParsedCall, ParsedOutput
from server.telemetry import tracing

Prepare = Callable[[list[dict[str, Any]], ChatOptions], Awaitable[Prepared]]
Generate = Callable[[list[GenerateRequest]], Awaitable[Generation]]


@dataclass(frozen=True, slots=True)
class McpCall:
    id: str  # the output item's id ("mcp_...")
    call_id: str  # the call's id in the chat conversation
    server_label: str
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True, slots=True)
class Output:
    """Generated text or reasoning as it comes; the client's own function calls at the end
    of the round that made them."""

    deltas: list[Delta]


@dataclass(frozen=True, slots=True)
class CallStarted:
    call: McpCall


@dataclass(frozen=True, slots=True)
class CallDone:
    call: McpCall
    outcome: CallOutcome


@dataclass(frozen=True, slots=True)
class ApprovalNeeded:
    call: McpCall


@dataclass(frozen=True, slots=True)
class RoundDone:
    """One model round ended (its counts, for usage)."""

    total: Choice
    num_prompt_tokens: int


@dataclass(slots=True)
class Finished:
    total: Choice  # the last round's finish; token counts summed over the rounds
    num_prompt_tokens: int  # summed over the rounds
    messages: list[dict[str, Any]]  # the conversation, tool turns included
    rounds: int
    # the last round's answer as an assistant turn; None when the turn ended on calls
    # that wait for the client (approvals, its own calls: already in `messages`)
    final_turn: dict[str, Any] | None


LoopEvent = Output | CallStarted | CallDone | ApprovalNeeded | RoundDone | Finished


@dataclass(slots=True)
class LoopSpec:
    toolset: Toolset
    messages: list[dict[str, Any]]
    options: ChatOptions  # the client's own tools and choice (an MCP choice: a named one)
    prepare: Prepare
    generate: Generate
    limits: McpSection  # max_tool_iterations, max_calls_per_round, max_loop_s
    # calls a previous turn asked approval for, with the answer: run (or declined) first
    resumed: list[tuple[McpCall, bool]] = field(default_factory=list)


def tool_turn(call: McpCall, outcome: CallOutcome) -> dict[str, Any]:
    content = outcome.output if outcome.error is None else f"Error: {outcome.error}"
    return {"role": "tool", "tool_call_id": call.call_id, "content": content or ""}


def _arguments(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


async def _run_call(
    toolset: Toolset, call: McpCall, deadline: float, round_span: Any = None,
    refusal: str | None = None,
) -> AsyncIterator[LoopEvent]:  # fmt: skip
    """One call's events; `refusal`: not run, the model is told why."""
    yield CallStarted(call)
    if refusal is not None:
        yield CallDone(call, CallOutcome(None, refusal))
        return
    arguments = _arguments(call.arguments)
    outcome = await toolset.call(call.server_label, call.name, arguments, parent=round_span,
                                 budget_s=deadline - time.monotonic())  # fmt: skip
    yield CallDone(call, outcome)


def _over_limit(limits: McpSection, num_run: int, deadline: float) -> str | None:
    """Why a call may not run (None: it may): this round ran its calls, or the request's
    time for calls is spent."""
    if num_run >= limits.max_calls_per_round:
        return (f"not run: at most {limits.max_calls_per_round} MCP tool calls run per "
                "model round (mcp.max_calls_per_round)")  # fmt: skip
    if time.monotonic() >= deadline:
        return (f"not run: the request's time for MCP tool calls ({limits.max_loop_s:g} s, "
                "mcp.max_loop_s) ran out")  # fmt: skip
    return None


def _round_options(spec: LoopSpec, iteration: int, last: bool = False) -> ChatOptions:
    """The tools every round describes the same way; what the grammar allows this round
    (`last`: no MCP calls, as past the iterations)."""
    tools = spec.options.tools + spec.toolset.functions()
    first = spec.options.tool_choice
    if last or iteration >= spec.limits.max_tool_iterations:
        # The last round may not call MCP tools: the client's own, if any, stay callable.
        choice = ToolChoice("none") if not spec.options.tools else ToolChoice("auto")
        if spec.options.tools:
            tools = spec.options.tools
    elif iteration == 0 or first.mode == "required":
        # a named tool is forced once; "required" holds until the limit, which ends it
        choice = first if _can_call(first, tools) else ToolChoice("auto")
    else:
        choice = ToolChoice("none") if first.mode == "none" else ToolChoice("auto")
    prompt_choice = ToolChoice("none") if first.mode == "none" else ToolChoice("auto")
    return replace(spec.options, tools=tools, tool_choice=choice, prompt_choice=prompt_choice)


def _can_call(choice: ToolChoice, tools: tuple[Tool, ...]) -> bool:
    """False for a forced call whose tool is not offered (its server could not list its
    tools): the round runs free instead, and the listing's error tells why."""
    if choice.mode == "named":
        return any(t.name == choice.name for t in tools)
    return choice.mode != "required" or bool(tools)


async def run_loop(spec: LoopSpec) -> AsyncIterator[LoopEvent]:
    messages = list(spec.messages)
    deadline = time.monotonic() + spec.limits.max_loop_s
    for call, approved in spec.resumed:
        if approved:
            async for event in _run_call(spec.toolset, call, deadline):
                yield event
                if isinstance(event, CallDone):
                    messages.append(tool_turn(call, event.outcome))
        else:
            declined = CallOutcome(None, "the user declined this tool call")
            messages.append(tool_turn(call, declined))
    total, num_prompt, rounds = Choice(), 0, 0
    final: dict[str, Any] | None = None
    while True:
        # The round span is not made current: this generator yields inside it.
        round_span = tracing.open_span("mcp.round", **{"kvserve.mcp.round": rounds + 1})
        try:
            options = _round_options(spec, rounds, last=time.monotonic() >= deadline)
            prepared = await spec.prepare(messages, options)
            generation = await spec.generate(prepared.requests)
            (state,) = prepared.states()
            output = ParsedOutput()
            async for increment in steps(generation, [state]):
                for step in increment:
                    output.add(step.deltas)
                    # calls are shown once the round is over: only the client's own
                    shown = [d for d in step.deltas if d.kind in ("content", "reasoning")]
                    if shown:
                        yield Output(shown)
            rounds += 1
            round_total = state.total
            num_prompt += len(prepared.prompt)
            total = _summed(total, round_total)
            yield RoundDone(round_total, len(prepared.prompt))
            ours = [
                McpCall(f"mcp_{secrets.token_hex(16)}", c.call_id, owner.ref.label, c.name,
                        c.arguments)
                for c in output.calls
                if (owner := spec.toolset.owner(c.name)) is not None
            ]  # fmt: skip
            theirs = [c for c in output.calls if spec.toolset.owner(c.name) is None]
            _trace_round(round_span, round_total, len(ours))
            if theirs:
                deltas = []
                for c in theirs:
                    deltas += [Delta("start", c.name, c.index, c.call_id),
                               Delta("args", c.arguments, c.index)]  # fmt: skip
                yield Output(deltas)
            turn = _assistant_turn(output.content, output.calls)
            if not ours or round_total.finish_reason is not FinishReason.STOP:
                final = turn
                break
            messages.append(turn)
            waiting, num_run = False, 0
            for call in ours:
                server = spec.toolset.server(call.server_label)
                if server is not None and server.needs_approval(call.name):
                    waiting = True
                    yield ApprovalNeeded(call)
                    continue
                refusal = _over_limit(spec.limits, num_run, deadline)
                num_run += refusal is None
                async for event in _run_call(spec.toolset, call, deadline, round_span, refusal):
                    yield event
                    if isinstance(event, CallDone):
                        messages.append(tool_turn(call, event.outcome))
            if waiting or theirs:
                final = None
                break  # the client answers (an approval, its own calls), then the loop goes on
        finally:
            if round_span is not None:
                round_span.end()
    yield Finished(total, num_prompt, messages, rounds, final)


def _trace_round(span: Any, counts: Choice, mcp_calls: int) -> None:
    """The round's counts on its span: `kvserve.tokens.reused` > 0 from round 2 on shows
    it continued on the previous round's KV."""
    if span is not None:
        span.set_attributes({
            "kvserve.tokens.prompt": counts.num_prompt_tokens,
            "kvserve.tokens.reused": counts.num_cached_tokens,
            "kvserve.tokens.generated": counts.num_output_tokens,
            "kvserve.finish_reason": str(counts.finish_reason or ""),
            "kvserve.mcp.calls": mcp_calls,
        })  # fmt: skip


def _assistant_turn(text: str, calls: list[ParsedCall]) -> dict[str, Any]:
    turn: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
    if calls:
        turn["tool_calls"] = [{"id": c.call_id, "type": "function",
                               "function": {"name": c.name, "arguments": c.arguments or "{}"}}
                              for c in calls]  # fmt: skip
    return turn


def _summed(a: Choice, b: Choice) -> Choice:
    """b's finish with the token counts of both."""
    out = Choice(finish_reason=b.finish_reason, error=b.error, stop_sequence=b.stop_sequence)
    out.num_prompt_tokens = a.num_prompt_tokens + b.num_prompt_tokens
    out.num_cached_tokens = a.num_cached_tokens + b.num_cached_tokens
    out.num_output_tokens = a.num_output_tokens + b.num_output_tokens
    return out
