"""Who may manage models: pull, delete and copy them (`/api/pull`, `/api/delete`,
`/api/copy`), load and unload them (`/v1/models/{id}/load|unload`), and change how long
one stays loaded for everyone (a request's `keep_alive`, server/models/keep_alive.py:
`check_keep_alive` here).

One rule, `[server] model_management`:
- "off": no one; 403 that says so.
- "auto" (the default): with API keys, an admin key (`[auth] admin_api_keys`: 403 for
  any other key). Without keys, only a server bound to a loopback address, as Ollama
  trusts its own machine: a server reachable from the network (the Docker image listens
  on 0.0.0.0) must not let a stranger delete models.
- "on": as "auto", but without keys anyone may, wherever the server listens.
A missing or wrong key is a 401 before any of this (require_api_key).

A question about the caller, asked by the routes' dependencies, so it sits in http/ with
them: the models themselves (server/models/) never ask who is calling.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING

from fastapi import Request

from server.errors import Forbidden
from server.http.deps import get_caller, require_api_key
from server.models.keep_alive import describe, residency

if TYPE_CHECKING:
    from server.models.served import ServedModel

WHAT = "managing models (pull, delete, copy, load, unload, keep_alive)"


def is_loopback(host: str) -> bool:
    """Whether a listening address is this machine's only ("localhost", 127.0.0.0/8, ::1)."""
    host = host.strip().strip("[]")
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # another host name: it may resolve to anything
        return False


def refusal(request: Request) -> Forbidden | None:
    """Why this (authenticated) caller may not manage models; None if it may."""
    settings = request.app.state.settings
    mode = settings.server.model_management
    if mode == "off":
        return Forbidden(
            f'{WHAT} is turned off on this server ([server] model_management = "off")',
            code="model_management_off",
        )
    if settings.auth.enabled:
        if get_caller(request).admin:
            return None
        return Forbidden(
            f"{WHAT} takes an admin key ([auth] admin_api_keys)", code="admin_key_required"
        )
    if mode == "auto" and not is_loopback(settings.server.host):
        return Forbidden(
            f"{WHAT} is off: this server has no API keys and listens on "
            f"{settings.server.host}, beyond this machine; set [auth] admin_api_keys (or "
            '[server] model_management = "on" to let anyone)',
            code="model_management_off",
        )
    return None


def may_manage(request: Request) -> bool:
    return refusal(request) is None


def require_manager(request: Request) -> None:
    """The dependency of every management route: 401 without a valid key, 403 when this
    caller may not manage models (in the route's own error shape: errors.render)."""
    require_api_key(request)
    refused = refusal(request)
    if refused is not None:
        raise refused


def keep_alive_refusal(
    request: Request, served: ServedModel, seconds: float | None
) -> Forbidden | None:
    """The 403 for a keep_alive this caller may not set on `served`; None when it may
    (or sent none, or asked for what the model does now)."""
    if seconds is None or residency(seconds) == served.unload_after_s:
        return None
    refused = refusal(request)
    if refused is None:
        return None
    wanted, now = describe(residency(seconds)), describe(served.unload_after_s)
    return Forbidden(
        f"'keep_alive' asks for '{served.id}' to be {wanted}, for every caller (it is "
        f"{now}): {refused.message}",
        param="keep_alive",
        code=refused.code,
    )


def check_keep_alive(request: Request, served: ServedModel, seconds: float | None) -> None:
    refused = keep_alive_refusal(request, served, seconds)
    if refused is not None:
        raise refused
