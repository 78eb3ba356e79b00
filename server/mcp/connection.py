"""One MCP server's connection, on the official `mcp` SDK.

The SDK's `Client` is an async context whose task group must be entered and left by one
task, so each connection has an owner task that holds it open; requests call through it
from their own tasks. It connects on first use (a server that is down at start-up does
not stop kvserve), lists its tools once, lists them again after the server sends
`notifications/tools/list_changed`, and reconnects on the next use after it drops.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx2
import mcp_types
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ListenNotSupportedError
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from server.config.mcp import McpServerSection
from server.mcp.outcome import CallOutcome, McpTool, McpUnavailable
from server.telemetry import tracing

log = logging.getLogger("kvserve.mcp")


def _reason(exc: BaseException) -> str:
    """The innermost cause of a (possibly grouped) connection failure, in one line."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def result_text(content: Sequence[Any]) -> str:
    """A tool result's content blocks as text; blocks a text model cannot read are named."""
    parts = []
    for block in content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        else:
            parts.append(f"[{getattr(block, 'type', 'unknown')} content omitted]")
    return "\n".join(parts)


class McpConnection:
    def __init__(
        self,
        spec: McpServerSection,
        connect_timeout_s: float,
        headers: dict[str, str] | None = None,
        *,
        retry_s: float = 5.0,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self.spec = spec
        self._connect_timeout_s = connect_timeout_s
        self._retry_s = retry_s
        self._headers = {**spec.http_headers(), **(headers or {})}
        self._client: Client | None = None
        self._owner: asyncio.Task[None] | None = None
        self._attempt: asyncio.Task[Client] | None = None  # the one connect in flight
        self._failed: tuple[float, str] | None = None  # (when it may be tried again, why)
        self._stop = asyncio.Event()
        self._lock = asyncio.Lock()  # closers only: requests never wait on it
        self._tools: tuple[McpTool, ...] | None = None
        self._on_close = on_close

    def _transport(self, stack: contextlib.AsyncExitStack) -> Any:
        spec = self.spec
        if spec.transport == "stdio":
            # no headers here: the SDK puts the traceparent in each request's `_meta`
            return StdioServerParameters(command=spec.command, args=list(spec.args))
        if spec.transport == "sse":
            return sse_client(spec.url, headers=self._headers, httpx_client_factory=_traced_client)
        http = _traced_client(headers=self._headers)
        stack.push_async_callback(http.aclose)  # a client handed in is ours to close
        return streamable_http_client(spec.url, http_client=http)

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, mcp_types.ToolListChangedNotification):
            log.info("mcp server %s: tool list changed", self.spec.label)
            self._tools = None  # listed again on the next use

    async def _hold(self, ready: asyncio.Future[None]) -> None:
        """The owner task: enter the client, keep it open until closed or dropped."""
        try:
            async with contextlib.AsyncExitStack() as stack:
                transport = self._transport(stack)
                client = Client(transport, message_handler=self._on_message, cache=None)
                await stack.enter_async_context(client)
                self._client = client
                ready.set_result(None)
                await self._watch(client)
        except BaseException as exc:  # noqa: BLE001 - reported to whoever waits
            if not ready.done():
                ready.set_exception(McpUnavailable(_reason(exc)))
            elif not isinstance(exc, asyncio.CancelledError):
                log.warning("mcp server %s: connection lost: %s", self.spec.label, _reason(exc))
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self._client = None
            self._tools = None

    async def _watch(self, client: Client) -> None:
        """Until closed: on 2026-07-28 connections list changes come by a `listen` stream
        (older ones send notifications, seen by `_on_message`)."""
        listener = asyncio.create_task(self._listen(client))
        try:
            await self._stop.wait()
        finally:
            listener.cancel()
            with contextlib.suppress(BaseException):
                await listener

    async def _listen(self, client: Client) -> None:
        try:
            async with client.listen(tools_list_changed=True) as changes:
                async for _ in changes:
                    log.info("mcp server %s: tool list changed", self.spec.label)
                    self._tools = None
        except (ListenNotSupportedError, MCPError):
            return  # a handshake-era server: notifications instead
        except Exception as exc:  # noqa: BLE001 - the tools are still listed on first use
            log.info("mcp server %s: no list-change stream: %s", self.spec.label, _reason(exc))

    async def _connected(self) -> Client:
        """The open client. Single flight: concurrent callers wait for one connect attempt
        (no lock is held across it, so a server that does not answer costs every waiter
        one connect_timeout_s at most, not one each in turn), and a failed attempt is
        remembered for `retry_s`: the requests meanwhile fail at once with its reason."""
        if self._client is not None and self._owner is not None and not self._owner.done():
            return self._client
        if self._failed is not None:
            until, reason = self._failed
            left = until - time.monotonic()
            if left > 0:
                raise McpUnavailable(f"{reason} (not tried again for {left:.1f} s)")
        if self._attempt is None or self._attempt.done():
            # A fresh context: the connection outlives the request that opened it, and
            # must not carry that request's trace span (its traceparent) into later ones.
            self._attempt = asyncio.create_task(self._connect(), name="mcp-connect",
                                                context=contextvars.Context())  # fmt: skip
            # its failure is read by the waiters below, or here if they all went away
            self._attempt.add_done_callback(lambda t: t.cancelled() or t.exception())
        # shielded: a waiter that gives up (its client left) does not end the others' wait
        return await asyncio.shield(self._attempt)

    async def _connect(self) -> Client:
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # read below, or (past its timeout) here: never left unretrieved
        ready.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._stop = asyncio.Event()
        self._owner = asyncio.create_task(self._hold(ready), name=f"mcp:{self.spec.label}")
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                await asyncio.shield(ready)
        except BaseException as exc:  # noqa: BLE001 - timed out, refused, or closed meanwhile
            await self._end_owner(grace_s=0)  # not connected: nothing to close gracefully
            if isinstance(exc, asyncio.CancelledError):
                raise
            reason = (f"no answer within {self._connect_timeout_s:g} s"
                      if isinstance(exc, TimeoutError) else str(exc))  # fmt: skip
            self._failed = (time.monotonic() + self._retry_s, reason)
            raise McpUnavailable(reason) from None
        self._failed = None
        assert self._client is not None
        return self._client

    async def tools(self) -> tuple[McpTool, ...]:
        """The server's tools (listed once; again after list_changed). Raises McpUnavailable."""
        client = await self._connected()
        if self._tools is not None:
            return self._tools
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                listed: list[McpTool] = []
                cursor = None
                for _ in range(100):  # pages
                    page = await client.list_tools(cursor=cursor, cache_mode="refresh")
                    listed += [McpTool(t.name, t.description or "", dict(t.input_schema))
                               for t in page.tools]  # fmt: skip
                    cursor = page.next_cursor
                    if cursor is None:
                        break
        except Exception as exc:
            raise McpUnavailable(f"listing tools failed: {_reason(exc)}") from exc
        self._tools = tuple(listed)
        return self._tools

    async def call(
        self, name: str, arguments: dict[str, Any], max_chars: int, budget_s: float | None = None
    ) -> CallOutcome:
        """Call a tool, within its `timeout_s` or the request's `budget_s` (what is left
        of mcp.max_loop_s), the shorter. Failures come back as an error outcome, never
        raised; cancelling the caller (a client that went away) cancels the call on the
        server."""
        timeout = self.spec.timeout_s
        if budget_s is not None and budget_s < timeout:
            timeout = max(budget_s, 0.0)
            late = (f"the tool '{name}' was cut off: the request's time for MCP tool "
                    "calls (mcp.max_loop_s) ran out")  # fmt: skip
        else:
            late = f"the tool '{name}' did not answer within {timeout:g} s"
        try:
            client = await self._connected()
            async with asyncio.timeout(timeout):
                result = await client.call_tool(name, arguments)
        except TimeoutError:
            return CallOutcome(None, late)
        except McpUnavailable as exc:
            return CallOutcome(None, f"MCP server '{self.spec.label}' is unavailable: {exc}")
        except Exception as exc:  # noqa: BLE001 - the model reads what went wrong
            return CallOutcome(None, f"calling '{name}' failed: {_reason(exc)}")
        text = capped(result_text(result.content), max_chars)
        if result.is_error:
            return CallOutcome(None, text or f"the tool '{name}' failed")
        return CallOutcome(text, None)

    async def _end_owner(self, grace_s: float = 5.0) -> None:
        """Stop the owner task: asked to leave the client (its session closed on the
        server), cancelled after `grace_s` (at once with 0: one still connecting)."""
        owner, self._owner = self._owner, None
        if owner is None:
            return
        self._stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(owner), grace_s)
        except (TimeoutError, asyncio.CancelledError):
            owner.cancel()
            with contextlib.suppress(BaseException):
                await owner
        except BaseException:  # noqa: BLE001 - already logged by the owner
            pass

    async def close(self) -> None:
        """End the connection (and a connect in flight); `on_close` runs once, whatever
        happens on the way."""
        try:
            async with self._lock:
                attempt = self._attempt
                if attempt is not None and not attempt.done():
                    attempt.cancel()
                    with contextlib.suppress(BaseException):
                        await attempt
                await self._end_owner()
        finally:
            on_close, self._on_close = self._on_close, None
            if on_close is not None:
                on_close()


async def _trace_headers(request: httpx2.Request) -> None:
    """Each HTTP request to an MCP server carries the W3C `traceparent` of the span current
    where it was sent. The SDK's HTTP transports send a message in its sender's context
    (the request's task, inside its `mcp.call` span), so a shared connection's requests
    each carry their own caller's trace; none when tracing is off."""
    request.headers.update(tracing.outgoing_headers())


def _traced_client(
    headers: dict[str, str] | None = None,
    timeout: httpx2.Timeout | None = None,
    auth: httpx2.Auth | None = None,
) -> httpx2.AsyncClient:
    """The SDK's HTTP client (its timeouts), with the traceparent added per request."""
    client = create_mcp_http_client(headers=headers, timeout=timeout, auth=auth)
    client.event_hooks["request"].append(_trace_headers)
    return client


def capped(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    return (text[:max_chars] + f"\n[kvserve: the tool result was cut from {len(text):,} to "
            f"{max_chars:,} characters]")  # fmt: skip
