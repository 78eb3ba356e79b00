"""What every API's MCP path shares: the session the loop runs on, how a round's prompt is
prepared, and building and listing the request's toolset with errors in the API's own
shape."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from fastapi import Request

from chat.plan import ChatOptions
from engine.client import SessionBusyError, SessionPool, check_session_id
from server.errors import BadRequest, TooManyRequests, params_renamed
from server.http.deps import Caller, EngineLike
from server.mcp.loop import Prepare
from server.mcp.manager import McpManager
from server.mcp.outcome import McpBusy
from server.mcp.toolset import McpRef, Toolset, list_tools, resolve
from server.models.served import ServedModel
from server.serving import sse
from server.serving.engine_requests import RequestSampling
from server.serving.prepare import Prepared, prepare_chat

log = logging.getLogger("kvserve.mcp")


def refuse(param: str, message: str) -> Exception:
    """The toolset's refusals, their message starting with the field (as every 400 here)."""
    return BadRequest(f"{param}: {message}", param=param)


def mcp_manager(request: Request) -> McpManager:
    return request.app.state.mcp  # type: ignore[no-any-return]


async def open_toolset(request: Request, refs: list[McpRef], caller: Caller) -> Toolset:
    """The request's MCP servers, checked against the configuration and listed. Use it
    through `mcp_turn`, which closes what it opens."""
    try:
        toolset = resolve(mcp_manager(request), refs, caller.tenant, refuse)
    except McpBusy as exc:
        raise TooManyRequests(str(exc), headers={"Retry-After": "1"}) from None
    try:
        await list_tools(toolset, refuse)
    except BaseException:
        toolset.close_soon()
        raise
    return toolset


@dataclass(slots=True)
class McpTurn:
    """What one MCP request holds: its toolset (with the private connections) and its
    clean-up (those connections, the loop's internal session)."""

    toolset: Toolset
    cleanup: Callable[[], None]
    handed_over: bool = False

    def stream(self, events: AsyncIterator[Any]) -> sse.EventStream:
        """The SSE response of `events`; the clean-up is now the stream's, run at its end
        in every case (server/serving/sse.py)."""
        response = sse.event_stream(events, on_close=self.cleanup)
        self.handed_over = True
        return response


@contextlib.asynccontextmanager
async def mcp_turn(
    request: Request, refs: list[McpRef], caller: Caller, engine: EngineLike,
    internal_session: str | None,
) -> AsyncIterator[McpTurn]:  # fmt: skip
    """Open the request's toolset, and clean up on every way out of the block (a return,
    a refusal, a cancelled request) unless a stream took the clean-up over. Everything
    that can be checked without the servers is checked before this: a refusal then opens
    nothing at all."""
    toolset = await open_toolset(request, refs, caller)
    turn = McpTurn(toolset, cleanup_later(engine, caller.tenant, internal_session, toolset))
    try:
        yield turn
    finally:
        if not turn.handed_over:
            turn.cleanup()


@runtime_checkable
class McpChoice(Protocol):
    """An mcp tool_choice (`{"type": "mcp", "server_label", "name"}`: the APIs' model is
    server/api/common.py McpToolChoice), read by its shape so that mcp/ imports no API."""

    server_label: str
    name: str | None


def check_mcp_choice(choice: object, toolset: Toolset) -> None:
    """An mcp tool_choice names a server of the request, and a tool it offers."""
    if not isinstance(choice, McpChoice):
        return
    server = toolset.server(choice.server_label)
    if server is None:
        raise BadRequest(
            f"tool_choice names the server '{choice.server_label}', which is not "
            "among the mcp tools",
            param="tool_choice.server_label",
        )
    offered = server.error is not None or toolset.owner(choice.name or "") is server
    if choice.name is not None and not offered:
        raise BadRequest(
            f"tool_choice names '{choice.name}', which '{choice.server_label}' does not offer",
            param="tool_choice.name",
        )


def loop_session(given: str | None) -> tuple[str, SessionPool, bool]:
    """The session the rounds run on: the request's own, else an internal one (in the
    chain pool, so it never counts against the sessions clients name), ended after. A
    given id is checked here, before any MCP server is contacted (the engine would only
    refuse it at the first round)."""
    if given is not None:
        return check_session_id(given), SessionPool.NAMED, False
    return "mcp_loop_" + secrets.token_hex(12), SessionPool.CHAIN, True


def loop_prepare(
    served: ServedModel,
    sampling: RequestSampling,
    caller: Caller,
    pool: SessionPool,
    *,
    max_tokens: int | None,
    head: Sequence[dict[str, Any]] = (),
    overflow: str = "error",
    param_name: Callable[[str | None], str | None] | None = None,
) -> Prepare:
    """How the loop prepares each round: `head` (a system turn) before the round's
    messages, the requests on the loop's session pool, and a refusal's field renamed by
    `param_name` into the API's own spelling."""
    sampling = replace(sampling, session_pool=pool)

    async def prepare(messages: list[dict[str, Any]], opts: ChatOptions) -> Prepared:
        with params_renamed(param_name or (lambda param: param)):
            prepared = await prepare_chat(
                served.engine, served.template, [*head, *messages], opts, sampling, caller,
                max_tokens=max_tokens, overflow=overflow,
            )  # fmt: skip
        return prepared

    return prepare


async def end_internal_session(engine: EngineLike, tenant: str, session_id: str) -> None:
    """End an internal loop session; a generation still being aborted keeps it busy a
    moment, so try again a few times (past that it expires by its TTL)."""
    for _ in range(20):
        try:
            engine.delete_session(tenant, session_id)
            return
        except SessionBusyError:
            await asyncio.sleep(0.25)
        except Exception:  # noqa: BLE001 - never created (the first round was refused)
            return
    log.warning("internal MCP loop session %s still busy; left to its TTL", session_id)


def cleanup_later(
    engine: EngineLike, tenant: str, internal_session: str | None, toolset: Toolset
) -> Callable[[], None]:
    """The clean-up of a loop (the request's private connections, its internal session)
    as a callable that may run anywhere (an SSE stream's end runs on a worker thread),
    once, and even when the request's task was cancelled."""
    loop = asyncio.get_running_loop()
    started = False

    async def run() -> None:
        with contextlib.suppress(Exception):
            await toolset.close()
        if internal_session is not None:
            await end_internal_session(engine, tenant, internal_session)

    def start() -> None:
        nonlocal started
        if not started:
            started = True
            task = asyncio.ensure_future(run())
            _pending.add(task)
            task.add_done_callback(_pending.discard)

    def cleanup() -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nothing left to clean
            loop.call_soon_threadsafe(start)

    return cleanup


_pending: set[asyncio.Future[None]] = set()
