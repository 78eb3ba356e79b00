"""Every error leaves in its API's shape: OpenAI's {"error": {"message", "type", "param",
"code"}} unless the API whose paths it is on names its own (`ErrorShape`: Anthropic's
{"type": "error", "error": {"type", "message"}} on /v1/messages, Ollama's {"error": "..."}
on /api/; each API package's spec names its shape, server/http/apis.py).

The handlers are registered once (`install`): an APIError a handler raises, an engine
error (the EngineError family, mapped by `from_engine_error`), a validation error, and
anything unexpected (logged with its traceback, answered 500).

A leaf of server/ (it imports none of its sub-packages), because every layer raises these:
the model registry and loader, serving, MCP, the APIs, the HTTP plumbing; in http/ it
made the models, which http/ resolves, import http/ back."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.client import (
    TIME_LIMIT_CODES,
    ContextOverflowError,
    EngineError,
    EngineNotReadyError,
    EngineRecoveringError,
    InvalidRequestError,
    NoSlotError,
    QueueFullError,
    SessionBusyError,
    SessionNotFoundError,
    error_code,
)

log = logging.getLogger("kvserve.server")


class APIError(Exception):
    """An error a handler raises; becomes an OpenAI error body with `status`."""

    status = 400

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    @property
    def type(self) -> str:
        """OpenAI's error type, which follows the status as Anthropic's does."""
        return _OPENAI_TYPES.get(self.status, "server_error" if self.status >= 500 else
                                 "invalid_request_error")  # fmt: skip

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)

    def anthropic_body(self) -> dict[str, Any]:
        kind = _ANTHROPIC_TYPES.get(self.status, "api_error" if self.status >= 500 else
                                    "invalid_request_error")  # fmt: skip
        message = self.message if self.param is None else f"{self.param}: {self.message}"
        return {"type": "error", "error": {"type": kind, "message": message}}

    def ollama_body(self) -> dict[str, Any]:
        """Ollama's error shape: one string, which names the field when there is one."""
        named = self.param is None or self.param in self.message
        return {"error": self.message if named else f"{self.param}: {self.message}"}

    def response(self, shape: ErrorBody | None = None) -> JSONResponse:
        """This error as an answer, its body in `shape` (OpenAI's without one)."""
        body = self.body() if shape is None else shape(self)
        return JSONResponse(body, status_code=self.status, headers=self.headers)


# An API's error body for an error (`APIError.anthropic_body`, say).
ErrorBody = Callable[[APIError], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class ErrorShape:
    """The error body of an API on the paths that start with one of its `prefixes`."""

    prefixes: tuple[str, ...]
    body: ErrorBody


# The APIs' shapes where they are not OpenAI's, as `install` was given them from the one
# list of APIs (server/app.py). Module-wide, not per app: middleware that answers before
# any route is found has only the path, and the list is the same constant in every app.
_shapes: list[ErrorShape] = []


# The OpenAI-shaped body's `type` by status, where it is not "invalid_request_error" (4xx)
# or "server_error" (5xx). A Starlette HTTPException keeps its status (`install`), so its
# type follows that status too.
_OPENAI_TYPES = {
    403: "permission_error",
    429: "rate_limit_error",
    503: "service_unavailable",
    504: "timeout",
}

# Anthropic's error types by status (its API reference, "Errors").
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "api_error",
}


class BadRequest(APIError):
    status = 400


class Unsupported(BadRequest):
    """A field OpenAI defines that kvserve does not implement: refused, never ignored."""

    def __init__(self, param: str, detail: str = ""):
        super().__init__(
            f"'{param}' is not supported by this server{': ' + detail if detail else ''}",
            param=param,
            code="unsupported_parameter",
        )


class ContextTooLong(BadRequest):
    """A prompt that leaves the context no room (400 `context_length_exceeded`). On
    Anthropic's routes it is worded as Anthropic words it, because its clients read the
    figures back (Claude Code retries with a smaller max_tokens on the second form and
    offers to compact on the first)."""

    def __init__(self, exc: ContextOverflowError):
        super().__init__(exc.message, param=exc.param, code=exc.code)
        self.overflow = exc

    def anthropic_body(self) -> dict[str, Any]:
        o = self.overflow
        if o.num_prompt > o.n_ctx:
            message = f"prompt is too long: {o.num_prompt} tokens > {o.n_ctx} maximum"
        else:
            message = (f"input length and `max_tokens` exceed context limit: {o.num_prompt} "
                       f"+ {o.max_tokens or 1} > {o.n_ctx}, decrease input length or "
                       "`max_tokens` and try again")  # fmt: skip
        return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}


class Unauthorized(APIError):
    status = 401

    def __init__(self) -> None:
        super().__init__(
            "Incorrect or missing API key. Send it as 'Authorization: Bearer <key>' "
            "(or 'x-api-key: <key>').",
            code="invalid_api_key",
        )


class Forbidden(APIError):
    """Refused: a caller the server knows (or one it trusts without keys) asking for
    something it may not do (model management without an admin key), or a browser page
    of another origin; 401 is for a missing or wrong key."""

    status = 403


class NotFound(APIError):
    status = 404


class Conflict(APIError):
    status = 409


class RequestTimeout(APIError):
    status = 408


class PayloadTooLarge(APIError):
    status = 413


class TooManyRequests(APIError):
    status = 429


class ServerError(APIError):
    status = 500


class BadGateway(APIError):
    status = 502


class ServiceUnavailable(APIError):
    status = 503


class GatewayTimeout(APIError):
    status = 504


class InsufficientStorage(APIError):
    status = 507


class ClientDisconnected(Exception):
    """The client went away before its answer; raised where a handler waits for one
    (`until_disconnect`) and answered once, by the handler `install` registers."""


def client_gone() -> JSONResponse:
    """The answer to a client that disconnected: nobody reads it (nginx's 499)."""
    return JSONResponse({}, status_code=499)


@contextmanager
def params_renamed(rename: Callable[[str | None], str | None]) -> Iterator[None]:
    """A refusal raised inside the block names its field in the caller's API: the shared
    checks name the chat-completions field, each API spells it its own way."""
    try:
        yield
    except BadRequest as err:
        err.param = rename(err.param)
        raise


def generation_failure(error: str | None) -> APIError:
    """The error for a sequence the engine ended with an error: 504 naming the time
    limit it ran past, else 500 naming the cause (`engine_restarted` when the engine
    thread died and was rebuilt, `engine_error` for a failed decode, say)."""
    code = error_code(error)
    if code in TIME_LIMIT_CODES:
        return GatewayTimeout(error or code, code=code)
    return ServerError(f"generation failed: {error}", code=code or "engine_error")


def error_body(message: str, type_: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def from_engine_error(exc: Exception) -> APIError:
    """Map an engine exception to the HTTP error it means (an APIError raised on the way,
    say by request translation inside the same try, is already one)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ContextOverflowError):
        return ContextTooLong(exc)
    if isinstance(exc, InvalidRequestError):
        return BadRequest(exc.message, param=exc.param, code=exc.code)
    if isinstance(exc, QueueFullError):
        return TooManyRequests(
            str(exc), code="queue_full", headers={"Retry-After": str(exc.retry_after_s)}
        )
    if isinstance(exc, SessionNotFoundError):
        return NotFound(str(exc), param="session_id", code="session_not_found")
    if isinstance(exc, SessionBusyError):
        return Conflict(str(exc), param="session_id", code="session_busy")
    if isinstance(exc, NoSlotError):
        return TooManyRequests(str(exc), code="no_free_slot", headers={"Retry-After": "1"})
    if isinstance(exc, EngineRecoveringError):
        return ServiceUnavailable(str(exc), code="engine_recovering", headers={"Retry-After": "1"})
    if isinstance(exc, EngineNotReadyError):
        return ServiceUnavailable(str(exc), code="model_loading", headers={"Retry-After": "1"})
    return ServerError(f"{type(exc).__name__}: {exc}")


_TYPE_LABELS = {"str", "int", "float", "bool", "dict", "list", "function-after", "constrained-str"}


def _param_of(loc: tuple[Any, ...]) -> str | None:
    """('body', 'messages', 0, 'role') -> 'messages[0].role'."""
    parts = [p for p in loc if p != "body"]
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _TYPE_LABELS or "[" in str(part):
            continue  # pydantic's union-branch labels such as 'str' or 'list[int]'
        else:
            out += f".{part}" if out else str(part)
    return out or None


def _most_specific(errors: Sequence[Any]) -> Any:
    """The error whose reason to report. A value that matches no branch of a union (a prompt may be
    a string, strings, token ids...) fails every branch; "should be a valid string"
    from the first branch says less than, say, "should have at least 1 item" from the
    branch the value was meant for, so plain type mismatches yield to other errors of
    the same field."""
    field = tuple(errors[0]["loc"][:2])
    for error in errors:
        if tuple(error["loc"][:2]) == field and not str(error["type"]).endswith(
            ("_type", "_parsing")
        ):
            return error
    return errors[0]


def shape_of(path: str) -> ErrorBody | None:
    """The error body of the API `path` belongs to (None: OpenAI's)."""
    for shape in _shapes:
        if path.startswith(shape.prefixes):
            return shape.body
    return None


def shaped(err: APIError, path: str) -> JSONResponse:
    """`err` in the error shape of the API `path` belongs to (for middleware, which
    answers before any route is found)."""
    return err.response(shape_of(path))


def render(request: Request, err: APIError) -> JSONResponse:
    return shaped(err, request.url.path)


def _validation_error(exc: RequestValidationError) -> APIError:
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    param = _param_of(tuple(first.get("loc", ())))
    if errors:  # the field as the first error names it, the reason from the best one
        first = {**_most_specific(errors), "loc": first["loc"]}
    if first.get("type") == "json_invalid":
        message = "the request body is not valid JSON"
        param = None
    elif first.get("type") == "missing":
        message = f"'{param}' is required"
    elif param is None:  # the body itself: not a JSON object, say
        message = f"invalid request body: {first.get('msg')}"
    else:
        message = f"invalid value for '{param}': {first.get('msg')}"
    return BadRequest(message, param=param)


def install(app: FastAPI, shapes: Sequence[ErrorShape]) -> None:
    """The handlers, answering in `shapes` on their APIs' paths (OpenAI's elsewhere)."""
    _shapes[:] = shapes

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return render(request, exc)

    @app.exception_handler(EngineError)
    async def _engine_error(request: Request, exc: EngineError) -> JSONResponse:
        return render(request, from_engine_error(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return render(request, _validation_error(exc))

    @app.exception_handler(ClientDisconnected)
    async def _gone(request: Request, exc: ClientDisconnected) -> JSONResponse:
        return client_gone()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        cls = {404: NotFound, 405: BadRequest}.get(exc.status_code, BadRequest)
        err = cls(str(exc.detail))
        err.status = exc.status_code
        return render(request, err)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return render(request, ServerError(f"internal error: {type(exc).__name__}"))
