"""Request-scoped dependencies: the engine, the chat template, the API-key check."""

from __future__ import annotations

import hmac
from typing import Annotated, Protocol

import numpy as np
from fastapi import Depends, Request

from chat.template import ChatTemplate, TemplateError
from engine.engine import EngineState, Generation
from engine.types import EngineStats, GenerateRequest, ModelInfo
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


def check_model(engine: EngineLike, model: str) -> None:
    if model != engine.info.model_id:
        raise NotFound(
            f"The model '{model}' does not exist; this server serves '{engine.info.model_id}'.",
            param="model",
            code="model_not_found",
        )


EngineDep = Annotated[EngineLike, Depends(get_engine)]
TemplateDep = Annotated[ChatTemplate, Depends(get_template)]
