"""Ollama's model management: GET /api/tags, GET /api/ps, GET /api/version,
DELETE /api/delete, POST /api/copy (POST /api/pull: server/api/ollama/pull.py).

Names are Ollama's `name:tag`: a configured id answers to `id:latest` too, a pulled model
is `hf.co/org/repo:QUANT` (server/models/hub_models.py). What a list names is what a request
may send back. Copies are aliases of the same model, for the life of the process, never
under a hub name (that is what a pull serves). A delete acts on the name the request
means (resolved as any request's name is): a copy loses that name, a pulled model its
file too. What the configuration owns is not deletable: 400. Pull, copy and delete are
model management (server/http/management.py: an admin key where keys are configured).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import hashlib
import json
import os
import re
import time
from importlib import metadata
from typing import Any

from fastapi import APIRouter, Depends, Request

from server.errors import BadRequest, NotFound
from server.http.management import require_manager
from server.models.hub_models import PREFIXES, HubModelError, HubModels, quant_of
from server.models.served import ModelRegistry, ServedModel, matching_names, resolve_ollama_model

router = APIRouter()

# Ollama's expires_at for a model kept loaded for good (a negative keep_alive): the
# largest duration Go's time package holds, from now (about 292 years).
_FOREVER = dt.timedelta(microseconds=(2**63 - 1) // 1000)
_NAME = re.compile(r"[\w][\w./:-]*")  # what /api/copy accepts as a new name


def ollama_name(served: ServedModel) -> str:
    """The name Ollama clients see: with a tag (`:latest` when the id has none)."""
    return served.id if ":" in served.id.rsplit("/", 1)[-1] else f"{served.id}:latest"


def resolve(request: Request, name: str) -> ServedModel:
    """The served model `name` means, loaded or not: 404 in the words Ollama's model
    routes use (its generation routes add "try pulling it first": ollama_model)."""
    served = resolve_ollama_model(request.app.state.models, name)
    if served is None:
        raise NotFound(f"model '{name}' not found", param="model")
    return served


async def read_object(request: Request) -> dict[str, Any]:
    """The JSON object in the body; 400 for anything else."""
    try:
        body = json.loads(await request.body() or b"null")
    except (ValueError, RecursionError):
        raise BadRequest("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def name_field(body: dict[str, Any], field: str, legacy: str | None = None) -> str:
    """A required model name (`legacy`: Ollama's older spelling of the field, `name`)."""
    value = body.get(field)
    if value is None and legacy is not None:
        value, field = body.get(legacy), legacy if legacy in body else field
    if value is None:
        raise BadRequest(f"'{field}' is required", param=field)
    if not isinstance(value, str) or not value.strip():
        raise BadRequest(f"'{field}' must be a non-empty string", param=field)
    return value.strip()


def details(served: ServedModel) -> dict[str, Any]:
    """Ollama's `details`: from the loaded model, else what its file name tells."""
    family, quant, size = "", quant_of(served.path), ""
    if served.engine.ready:
        info = served.engine.info
        words = info.description.split()
        family = words[0] if words else ""
        quant = quant or (words[2] if len(words) > 2 else "")
        size = _human_count(info.n_params) if info.n_params else ""
    return {
        "parent_model": "",
        "format": "gguf",
        "family": family,
        "families": [family] if family else None,
        "parameter_size": size,
        "quantization_level": quant,
    }


# -- the routes ------------------------------------------------------------------------


@router.get("/api/version")
async def version() -> dict[str, str]:
    """kvserve's own version (it follows Ollama's API, it is not Ollama)."""
    try:
        return {"version": metadata.version("kvserve")}
    except metadata.PackageNotFoundError:
        return {"version": "0.0.0"}


@router.get("/api/tags")
async def tags(request: Request) -> dict[str, Any]:
    """Every model this server can serve, loaded or not."""
    request.app.state.hub_models.rescan()  # what other replicas pulled or deleted
    digests = _digests(request)
    return {"models": [await _entry(m, digests) for m in request.app.state.models]}


@router.get("/api/ps")
async def ps(request: Request) -> dict[str, Any]:
    """The loaded models, with when they will be unloaded if left idle."""
    out = []
    digests = _digests(request)
    for served in request.app.state.models:
        if not served.engine.ready:
            continue
        entry = await _entry(served, digests)
        info = served.engine.info
        memory = served.engine.memory_bytes or info.size_bytes
        out.append(
            {
                "name": entry["name"],
                "model": entry["model"],
                "size": memory,
                "digest": entry["digest"],
                "details": entry["details"],
                "expires_at": _expires_at(served),
                "size_vram": 0,  # what kvserve knows: it does not count offloaded bytes
                "context_length": info.n_ctx,
            }
        )
    return {"models": out}


@router.delete("/api/delete", dependencies=[Depends(require_manager)])
async def delete(request: Request) -> dict[str, Any]:
    """Delete a pulled model (its file too) or a copy (that name only)."""
    body = await read_object(request)
    name = name_field(body, "model", legacy="name")
    models: ModelRegistry = request.app.state.models
    hub: HubModels = request.app.state.hub_models
    # The name the request means, not any name of its model: deleting a copy by another
    # spelling ("MINE" for "mine") removes that copy, never the model it names.
    named = _one_name(models, name)
    served = resolve(request, named)
    if named in hub.copies:
        models.drop_alias(named)
        hub.copies.discard(named)
        return {}
    if not served.pulled:
        what = "a configured alias" if named != served.id else "a configured model"
        raise BadRequest(
            f"model '{name}' is {what}, not a pulled one: remove it from the configuration",
            param="model",
        )
    try:
        await hub.delete(served)
    except HubModelError as exc:
        raise BadRequest(f"model '{name}' cannot be deleted: {exc}", param="model") from None
    hub.copies.difference_update(served.aliases)
    return {}


def _one_name(models: ModelRegistry, name: str) -> str:
    names = matching_names(models, name)
    if not names:
        raise NotFound(f"model '{name}' not found", param="model")
    if len(names) > 1:
        listed = ", ".join(repr(n) for n in names)
        raise BadRequest(
            f"model '{name}' matches {listed}, which differ only in case: give the exact name",
            param="model",
        )
    return names[0]


@router.post("/api/copy", dependencies=[Depends(require_manager)])
async def copy(request: Request) -> dict[str, Any]:
    """Give a model one more name (an alias, not a second file)."""
    body = await read_object(request)
    source = name_field(body, "source")
    destination = name_field(body, "destination")
    served = resolve(request, source)
    if not _NAME.fullmatch(destination):
        raise BadRequest(f"'{destination}' is not a valid model name", param="destination")
    if destination.lower().startswith(PREFIXES):
        # The hub's names are what /api/pull fetches and serves: a copy under one would
        # make the later pull of that model fail (its name taken by another model).
        raise BadRequest(
            f"'{destination}' is a Hugging Face name, for what /api/pull downloads; a copy "
            "takes a name outside hf.co/",
            param="destination",
        )
    models: ModelRegistry = request.app.state.models
    taken = resolve_ollama_model(models, destination)
    copies: set[str] = request.app.state.hub_models.copies
    if taken is not None and taken is not served and destination not in copies:
        raise BadRequest(
            f"'{destination}' already names the model '{taken.id}'", param="destination"
        )
    if taken is None or destination in copies:
        models.alias(destination, served)
        copies.add(destination)
    return {}


# -- helpers -----------------------------------------------------------------------------


def _digests(request: Request) -> Digests:
    return request.app.state.__dict__.setdefault("digests", Digests())  # type: ignore[no-any-return]


async def _entry(served: ServedModel, digests: Digests) -> dict[str, Any]:
    path = served.engine.info.path if served.engine.ready else served.path
    size, modified = 0, None
    if path and os.path.exists(path):
        stat = os.stat(path)
        size, modified = stat.st_size, dt.datetime.fromtimestamp(stat.st_mtime, dt.UTC)
    name = ollama_name(served)
    return {
        "name": name,
        "model": name,
        "modified_at": (modified or dt.datetime.now(dt.UTC)).isoformat(),
        "size": size,
        "digest": await digests.of(path) if size else "",
        "details": details(served),
    }


class Digests:
    """Each file's sha256, computed once: remembered while the file keeps its size and
    age, and shared by the concurrent first asks (one read of a multi-GB GGUF, not one
    per client listing the models at once)."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[tuple[int, float], asyncio.Future[str]]] = {}

    async def of(self, path: str) -> str:
        """A hub blob's name is its digest; any other file is read once, in a thread."""
        real = os.path.realpath(path)
        blob = os.path.basename(real)
        if re.fullmatch(r"[0-9a-f]{64}", blob):
            return blob
        stat = os.stat(real)
        stamp = (stat.st_size, stat.st_mtime)
        known = self._known.get(real)
        if known is None or known[0] != stamp:
            task = asyncio.ensure_future(asyncio.to_thread(_sha256, real))
            known = self._known[real] = (stamp, task)
            task.add_done_callback(functools.partial(self._forget_failed, real))
        # shield: one client that leaves does not cancel the read the others wait for
        return await asyncio.shield(known[1])

    def _forget_failed(self, real: str, task: asyncio.Future[str]) -> None:
        """A read that failed (the file went away, say) is not remembered: the next ask
        tries again."""
        failed = task.cancelled() or task.exception() is not None
        if failed and self._known.get(real, ((0, 0.0), None))[1] is task:
            del self._known[real]


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _expires_at(served: ServedModel) -> str:
    """When an idle unload would take the model: `unload_after_s` (a keep_alive, else
    `idle_unload_s`) after its last use, a model in use counting from now; far off for a
    model that is never unloaded."""
    now = dt.datetime.now(dt.UTC)
    keep = served.unload_after_s
    if keep is None:
        return (now + _FOREVER).isoformat()
    idle = 0.0 if served.in_flight else max(0.0, time.monotonic() - served.last_used)
    return (now + dt.timedelta(seconds=max(0.0, keep - idle))).isoformat()


def _human_count(n: int) -> str:
    """Ollama's parameter_size: 134515008 -> "134.52M"."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}".rstrip("0").rstrip(".") + unit
    return str(n)
