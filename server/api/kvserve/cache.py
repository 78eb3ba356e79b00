"""The prefix cache: GET/DELETE /v1/cache, POST /v1/cache/warm.

A model's cache outlives its engine (unloaded, failed, or not loaded yet: the engine
opens it on demand, see `Engine.open_cache`), so status and purge answer for every
model whatever its state; only warming needs the model loaded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from pydantic import Field, model_validator

from chat.template import TemplateError
from engine.client import GenerateRequest
from server.api.common import RequestModel
from server.errors import BadRequest, generation_failure
from server.http.deps import Caller, CallerDep, registry, resolve_model
from server.http.lease import Lease, leased
from server.models.served import ServedModel
from server.serving.drive import tokenize

router = APIRouter()


class WarmMessage(RequestModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Annotated[str, Field(max_length=1 << 20)]


class CacheWarmRequest(RequestModel):
    model: str
    prompt: Annotated[str, Field(min_length=1)] | list[Annotated[int, Field(ge=0)]] | None = None
    messages: Annotated[list[WarmMessage], Field(min_length=1)] | None = None
    cache_salt: Annotated[str, Field(max_length=256)] | None = None

    @model_validator(mode="after")
    def _one_source(self) -> CacheWarmRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of 'prompt' and 'messages'")
        return self


def _tenant_object(served: ServedModel, caller: Caller) -> dict[str, Any]:
    engine = served.engine
    view = engine.tenant_cache_view(caller.tenant, caller.owns)
    return {
        "object": "cache",
        "model": served.id,
        "enabled": engine.cache_stats() is not None,
        "scope": "api_key",
        "entries": view.entries,
        "tokens": view.tokens,
        "requests": dict(view.requests),
        "reused_tokens": view.reused_tokens,
    }


def _cache_object(served: ServedModel) -> dict[str, Any]:
    engine = served.engine
    stats = engine.cache_stats()
    engine_stats = engine.stats()  # None while the model is not loaded
    body: dict[str, Any] = {
        "object": "cache",
        "model": served.id,
        "enabled": stats is not None,
        "scope": "server",
    }
    if stats is not None:
        body |= dataclasses.asdict(stats)
        body |= body.pop("tiers")  # each configured tier by its name, beside the totals
    if engine_stats is not None:
        body["requests"] = dict(engine_stats.hits)
        body["reused_tokens"] = engine_stats.num_reused_tokens
        body["restore_failures"] = engine_stats.num_restore_failures
    return body


@router.get("/v1/cache")
async def cache_status(request: Request, caller: CallerDep) -> dict[str, Any]:
    """Per model: for an admin key, entries, bytes, hits and misses per tier and requests
    by how their prompt was found; for any other key, the same about its own prefixes
    and requests only."""
    models = list(registry(request))
    for served in models:  # reads the disk tier's directory the first time: off the loop
        await asyncio.to_thread(served.engine.open_cache)
    if caller.admin:
        return {"object": "list", "data": [_cache_object(m) for m in models]}
    return {"object": "list", "data": [_tenant_object(m, caller) for m in models]}


@router.delete("/v1/cache")
async def purge_cache(request: Request, caller: CallerDep) -> dict[str, Any]:
    """Drop stored prefixes of every model, in RAM and on disk: every one for an admin
    key, the caller's own for any other key. Loaded or not: see the module's doc."""
    owns = None if caller.admin else caller.owns
    engines = [m.engine for m in registry(request)]
    # Deleting cache files is disk work: off the event loop.
    removed = sum([await asyncio.to_thread(e.purge_cache, owns) for e in engines])
    return {
        "object": "cache.purged",
        "scope": "server" if caller.admin else "api_key",
        "entries_removed": removed,
    }


@router.post("/v1/cache/warm")
async def warm_cache(
    request: Request,
    caller: CallerDep,
    lease: Annotated[Lease[CacheWarmRequest], leased(CacheWarmRequest)],
) -> dict[str, Any]:
    """Prefill a prompt (or a chat prefix, such as a shared system prompt or tool list)
    and store its KV, without generating."""
    body = lease.body
    body.log_unknown("cache.warm")
    served = resolve_model(request, body.model)
    engine, template = served.engine, served.template
    if body.messages is not None:
        messages = [{"role": m.role, "content": m.content} for m in body.messages]
        try:
            rendered = template.render(messages, add_generation_prompt=False)
        except TemplateError as exc:
            raise BadRequest(str(exc), param="messages") from exc
        tokens = await tokenize(
            engine, rendered.text, add_special=rendered.add_bos, parse_special=True
        )
    elif isinstance(body.prompt, str):
        tokens = await tokenize(engine, body.prompt, add_special=True, parse_special=True)
    else:
        tokens = list(body.prompt or [])
    job = GenerateRequest(
        request_id=uuid.uuid4().hex,
        prompt_tokens=tuple(tokens),
        max_tokens=0,
        tenant=caller.tenant,
        cache_salt=caller.salt(body.cache_salt),
    )
    last = None
    generation = await engine.generate([job])  # an EngineError: its handler (server/errors.py)
    async with generation:
        async for _, output in generation:
            if output.error is not None:
                raise generation_failure(output.error)
            last = output
    return {
        "object": "cache.warm",
        "model": engine.info.model_id,
        "tokens": len(tokens),
        "cached_tokens": last.num_cached_tokens if last is not None else 0,
        "cache_enabled": engine.cache_stats() is not None,
    }
