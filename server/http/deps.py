"""Request-scoped dependencies: the model a request names (its engine and template, as the
route's model dependency resolved it: server/http/lease.py), the API-key check, and the
caller."""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from chat.template import ChatTemplate
from engine.client import EngineLike, EngineState, check_session_id, salt_of_prefix
from server.config.tenant import tenant_of
from server.errors import BadRequest, NotFound, ServerError, ServiceUnavailable, Unauthorized
from server.models.served import ModelRegistry, ServedModel
from server.telemetry.access import current_record


def registry(request: Request) -> ModelRegistry:
    return request.app.state.models  # type: ignore[no-any-return]


def ready_engine(engine: EngineLike) -> EngineLike:
    """`engine`, or 503 while its model loads (500 if the load failed)."""
    if not engine.ready:
        if engine.state is EngineState.FAILED and engine.load_refused:  # loading cannot help
            raise BadRequest(engine.load_error or "the model cannot be served", param="model",
                             code="model_not_supported")  # fmt: skip
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


# Where a route's model dependency (server/http/lease.py) leaves the model it resolved:
# (the name as the body gave it, the model).
LEASED_MODEL = "leased_model"


def leased_model(request: Request, name: str) -> ServedModel | None:
    """The model the route's dependency already resolved for this request's `name`, so
    the route does not look it up again; None where it did not."""
    found = request.scope.get("state", {}).get(LEASED_MODEL)
    if found is not None and found[0] == name:
        return found[1]  # type: ignore[no-any-return]
    return None


def resolve_model(request: Request, name: str, *, require_ready: bool = True) -> ServedModel:
    """The served model a request names (by id or alias): 404 if none, 503 while loading."""
    served = leased_model(request, name) or registry(request).find(name)
    if served is None:
        known = ", ".join(repr(i) for i in registry(request).ids)
        raise NotFound(
            f"The model '{name}' does not exist; this server serves {known}.",
            param="model",
            code="model_not_found",
        )
    return claim(served, require_ready=require_ready)


def claim(served: ServedModel, *, require_ready: bool = True) -> ServedModel:
    """The model this request is for: named in its access record, and (with
    `require_ready`) its engine ready, else 503 while it loads."""
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
    return claim(registry(request).default).engine


def presented_key(request: Request) -> str:
    """The API key a request carries: `Authorization: Bearer <key>`, or Anthropic's
    `x-api-key: <key>` ("" if neither)."""
    return key_in(request.headers)


def key_in(headers: Mapping[str, str]) -> str:
    """`presented_key` from the headers alone (server/http/key_first.py has no Request)."""
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return headers.get("x-api-key", "").strip()


def key_accepted(headers: Mapping[str, str], keys: tuple[str, ...]) -> bool:
    """Whether the headers carry one of `keys` (any, when there are none)."""
    if not keys:
        return True
    token = key_in(headers)
    if not token:
        return False
    presented = token.encode()
    # Compare against every key, without an early exit, in constant time per key.
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(presented, key.encode())
    return matched


def require_api_key(request: Request) -> None:
    """A key check for the routes that want one of their own (model management's, which
    then asks for an admin key; /docs); every route but the open ones has had its key
    checked once already, before its body was read (server/http/key_first.py)."""
    if not key_accepted(request.headers, request.app.state.settings.auth.all_keys):
        raise Unauthorized()


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is asking: `tenant` is a digest of their API key ("" without auth). Sessions
    belong to a tenant, and prefixes are only shared within one (see `salt`). An admin
    (an [auth] admin_api_keys key, or anyone on a server without auth) sees and purges
    the whole cache; a tenant only its own share."""

    tenant: str
    session_header: str | None  # X-Kvserve-Session (`[server] session_headers`)
    admin: bool = False

    def owns(self, salt: str) -> bool:
        """True for the salts of this caller's stored prefixes: made by `salt`, with or
        without an adapter set after it (`GenerateRequest.prefix_salt`)."""
        base = salt_of_prefix(salt)
        return base == self.tenant or base.startswith(self.tenant + "/")

    def salt(self, cache_salt: str | None) -> str:
        return self.tenant if not cache_salt else f"{self.tenant}/{cache_salt}"


def session_header(request: Request) -> str | None:
    """The session a request names in a header (`[server] session_headers`, the first
    present), checked by the engine's rule for session ids where every route that reads
    it gets its caller: a bad one is a 400 naming the header, before the route opens
    anything. Written into the access record, so the log line names the session."""
    for name in request.app.state.settings.server.session_headers:
        value = request.headers.get(name)
        if value is not None:
            record = current_record()
            if record is not None:  # a bad one too (the log line escapes it)
                record.session = value[:128]
            return check_session_id(value, param=name)
    return None


def get_caller(request: Request) -> Caller:
    auth = request.app.state.settings.auth
    session = session_header(request)
    if not auth.enabled:
        return Caller("", session, admin=True)
    token = presented_key(request)
    tenant = tenant_of(token)
    admin = False
    for key in auth.admin_api_keys:  # (already authenticated: no timing to hide here)
        admin |= hmac.compare_digest(token.encode(), key.encode())
    record = current_record()
    if record is not None:
        record.tenant = tenant  # the status page's recent traffic is kept per key
    return Caller(tenant, session, admin)


EngineDep = Annotated[EngineLike, Depends(get_engine)]
async def _caller(request: Request) -> Caller:
    """`get_caller` as a dependency: FastAPI runs a plain `def` dependency in a worker
    thread, a hop per request for what reads a few headers."""
    return get_caller(request)


CallerDep = Annotated[Caller, Depends(_caller)]
