"""Request-scoped dependencies: the model a request names (its engine and template), the
API-key check."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Protocol

import numpy as np
from fastapi import Depends, Request

from chat.template import ChatTemplate
from engine.engine import EngineState, Generation
from engine.sessions import Session
from engine.types import (
    CacheStats,
    EngineStats,
    GenerateRequest,
    ModelInfo,
    TenantCacheView,
    salt_of_prefix,
)
from server.access import current_record
from server.errors import NotFound, ServerError, ServiceUnavailable, Unauthorized
from server.registry import ModelRegistry, ServedModel


class EngineLike(Protocol):
    """The narrow engine interface the server depends on (a fake implements it in tests)."""

    state: EngineState
    load_progress: float
    load_phase: str  # "loading", or "downloading" while a hub fetch runs
    load_error: str | None

    @property
    def ready(self) -> bool: ...
    @property
    def info(self) -> ModelInfo: ...
    def start(self) -> None: ...
    def close(self, timeout: float = ...) -> None: ...
    def tokenize(
        self, text: str, *, add_special: bool = ..., parse_special: bool = ...
    ) -> list[int]: ...
    def detokenize(self, tokens: list[int]) -> str: ...
    def token_bytes(self, token: int) -> bytes: ...
    def stats(self) -> EngineStats | None: ...
    async def generate(self, requests: list[GenerateRequest]) -> Generation: ...
    async def embed(self, inputs: list[list[int]]) -> list[np.ndarray]: ...
    def create_session(
        self, tenant: str, session_id: str | None = ..., ttl_s: float | None = ...
    ) -> Session: ...
    def get_session(self, tenant: str, session_id: str) -> Session: ...
    def list_sessions(self, tenant: str) -> list[Session]: ...
    def all_sessions(self) -> list[Session]: ...
    def delete_session(self, tenant: str, session_id: str) -> Session: ...
    def session_slot(self, key: str | None) -> int | None: ...
    async def fork_session(
        self, tenant: str, session_id: str, new_id: str | None = ..., ttl_s: float | None = ...
    ) -> Session: ...
    def open_cache(self) -> None: ...
    def cache_stats(self) -> CacheStats | None: ...
    def tenant_cache_view(self, tenant: str, owns: Callable[[str], bool]) -> TenantCacheView: ...
    def purge_cache(self, owns: Callable[[str], bool] | None = ...) -> int: ...
    # On-demand loading (server/loading.py)
    load_seconds: float

    @property
    def busy(self) -> bool: ...
    @property
    def memory_bytes(self) -> int: ...
    def unload(self) -> bool: ...
    def wait_stopped(self, timeout: float = ...) -> bool: ...


def registry(request: Request) -> ModelRegistry:
    return request.app.state.models  # type: ignore[no-any-return]


def ready_engine(engine: EngineLike) -> EngineLike:
    """`engine`, or 503 while its model loads (500 if the load failed)."""
    if not engine.ready:
        if engine.state is EngineState.FAILED:
            raise ServerError(f"the model failed to load: {engine.load_error}")
        if engine.state is EngineState.UNLOADED:  # loaded again by a generation request
            raise ServiceUnavailable(
                "the model is not loaded", code="model_unloaded", headers={"Retry-After": "5"}
            )
        raise ServiceUnavailable(
            f"the model is loading ({engine.load_progress:.0%})",
            code="model_loading",
            headers={"Retry-After": "1"},
        )
    return engine


def resolve_model(request: Request, name: str, *, require_ready: bool = True) -> ServedModel:
    """The served model a request names (by id or alias): 404 if none, 503 while loading."""
    served = registry(request).get(name)
    if served is None:
        known = ", ".join(repr(i) for i in registry(request).ids)
        raise NotFound(
            f"The model '{name}' does not exist; this server serves {known}.",
            param="model",
            code="model_not_found",
        )
    record = current_record()
    if record is not None:
        record.model = served.id
    if require_ready:
        ready_engine(served.engine)
    return served


def resolve_engine(request: Request, name: str) -> EngineLike:
    return resolve_model(request, name).engine


def resolve_template(request: Request, name: str) -> ChatTemplate:
    return resolve_model(request, name).template


def get_engine(request: Request) -> EngineLike:
    """The default (first) model's engine, for endpoints that name no model."""
    served = registry(request).default
    record = current_record()
    if record is not None:
        record.model = served.id
    return ready_engine(served.engine)


def presented_key(request: Request) -> str:
    """The API key a request carries: `Authorization: Bearer <key>`, or Anthropic's
    `x-api-key: <key>` ("" if neither)."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.headers.get("x-api-key", "").strip()


def require_api_key(request: Request) -> None:
    keys: tuple[str, ...] = request.app.state.settings.auth.all_keys
    if not keys:
        return
    token = presented_key(request)
    if not token:
        raise Unauthorized()
    presented = token.encode()
    # Compare against every key, without an early exit, in constant time per key.
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(presented, key.encode())
    if not matched:
        raise Unauthorized()


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is asking: `tenant` is a digest of their API key ("" without auth). Sessions
    belong to a tenant, and prefixes are only shared within one (see `salt`). An admin
    (an [auth] admin_api_keys key, or anyone on a server without auth) sees and purges
    the whole cache; a tenant only its own share."""

    tenant: str
    session_header: str | None  # X-Session-Id
    admin: bool = False

    def owns(self, salt: str) -> bool:
        """True for the salts of this caller's stored prefixes: made by `salt`, with or
        without an adapter set after it (`GenerateRequest.prefix_salt`)."""
        base = salt_of_prefix(salt)
        return base == self.tenant or base.startswith(self.tenant + "/")

    def salt(self, cache_salt: str | None) -> str:
        return self.tenant if not cache_salt else f"{self.tenant}/{cache_salt}"


def get_caller(request: Request) -> Caller:
    auth = request.app.state.settings.auth
    if not auth.enabled:
        return Caller("", request.headers.get("x-session-id"), admin=True)
    token = presented_key(request)
    tenant = hashlib.sha256(token.encode()).hexdigest()[:16]
    admin = False
    for key in auth.admin_api_keys:  # (already authenticated: no timing to hide here)
        admin |= hmac.compare_digest(token.encode(), key.encode())
    record = current_record()
    if record is not None:
        record.tenant = tenant  # the status page's recent traffic is kept per key
    return Caller(tenant, request.headers.get("x-session-id"), admin)


EngineDep = Annotated[EngineLike, Depends(get_engine)]
CallerDep = Annotated[Caller, Depends(get_caller)]
