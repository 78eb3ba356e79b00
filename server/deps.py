"""Request-scoped dependencies: the engine, the chat template, the API-key check."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Annotated, Protocol

import numpy as np
from fastapi import Depends, Request

from chat.template import ChatTemplate, TemplateError
from engine.engine import EngineState, Generation
from engine.sessions import Session
from engine.types import CacheStats, EngineStats, GenerateRequest, ModelInfo
from server.errors import NotFound, ServerError, ServiceUnavailable, Unauthorized


class EngineLike(Protocol):
    """The narrow engine interface the server depends on (a fake implements it in tests)."""

    state: EngineState
    load_progress: float
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
    def delete_session(self, tenant: str, session_id: str) -> Session: ...
    def session_slot(self, session_id: str | None) -> int | None: ...
    async def fork_session(
        self, tenant: str, session_id: str, new_id: str | None = ..., ttl_s: float | None = ...
    ) -> Session: ...
    def cache_stats(self) -> CacheStats | None: ...
    def purge_cache(self) -> int: ...


def get_engine(request: Request) -> EngineLike:
    engine: EngineLike = request.app.state.engine
    if not engine.ready:
        if engine.state is EngineState.FAILED:
            raise ServerError(f"the model failed to load: {engine.load_error}")
        raise ServiceUnavailable(
            f"the model is loading ({engine.load_progress:.0%})",
            code="model_loading",
            headers={"Retry-After": "1"},
        )
    return engine


def get_template(
    request: Request, engine: Annotated[EngineLike, Depends(get_engine)]
) -> ChatTemplate:
    template: ChatTemplate | None = getattr(request.app.state, "template", None)
    if template is None:
        info = engine.info
        override = request.app.state.template_override
        try:
            template = ChatTemplate(
                override or info.chat_template,
                bos_token=info.bos_token,
                eos_token=info.eos_token,
                add_bos=info.add_bos,
            )
        except TemplateError as exc:
            raise ServerError(str(exc)) from exc
        request.app.state.template = template
    return template


def require_api_key(request: Request) -> None:
    keys: tuple[str, ...] = request.app.state.settings.server.api_keys
    if not keys:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized()
    presented = token.strip().encode()
    # Compare against every key, without an early exit, in constant time per key.
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(presented, key.encode())
    if not matched:
        raise Unauthorized()


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is asking: `tenant` is a digest of their API key ("" without auth). Sessions
    belong to a tenant, and prefixes are only shared within one (see `salt`)."""

    tenant: str
    session_header: str | None  # X-Session-Id

    def salt(self, cache_salt: str | None) -> str:
        return self.tenant if not cache_salt else f"{self.tenant}/{cache_salt}"


def get_caller(request: Request) -> Caller:
    tenant = ""
    if request.app.state.settings.server.api_keys:
        token = request.headers.get("authorization", "").partition(" ")[2].strip()
        tenant = hashlib.sha256(token.encode()).hexdigest()[:16]
    return Caller(tenant, request.headers.get("x-session-id"))


def check_model(engine: EngineLike, model: str) -> None:
    if model != engine.info.model_id:
        raise NotFound(
            f"The model '{model}' does not exist; this server serves '{engine.info.model_id}'.",
            param="model",
            code="model_not_found",
        )


EngineDep = Annotated[EngineLike, Depends(get_engine)]
TemplateDep = Annotated[ChatTemplate, Depends(get_template)]
CallerDep = Annotated[Caller, Depends(get_caller)]
