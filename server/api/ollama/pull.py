"""POST /api/pull: a Hugging Face GGUF into the hub cache, then served without a restart.

Ollama's names for the hub: `hf.co/org/repo[:QUANT]` (or `huggingface.co/...`); its own
library's names (`llama3.2`) are refused. The download is server/models/hub.py's (the cache,
resume, HF_TOKEN, HF_ENDPOINT, offline mode, the sha256 check of a fresh download). The
answer is Ollama's progress, NDJSON: `pulling manifest`, `pulling <digest>` with `total`
and `completed` bytes, `verifying sha256 digest`, `success` (`stream: false`: only the
last object; a failure is `{"error": ...}`, in the stream or with its status). A pull
runs to its end when its client goes away, and a second pull of the same name follows
the one running instead of starting another.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from server.api.ollama.models import name_field, ollama_name, read_object
from server.config.hub import HubError, HubSource
from server.errors import (
    APIError,
    BadGateway,
    BadRequest,
    InsufficientStorage,
    NotFound,
    Unsupported,
)
from server.http.management import require_manager
from server.models import hub
from server.models.hub_models import HubModelError, HubModels, HubName
from server.models.pulls import Pull, Pulls
from server.models.served import ServedModel

router = APIRouter()

_FIELDS = {"model", "name", "stream", "insecure"}
_POLL_S = 0.25


@router.post("/api/pull", dependencies=[Depends(require_manager)])
async def pull(request: Request) -> Any:
    """Download a Hugging Face GGUF into the hub cache and serve it (model management)."""
    body = await read_object(request)
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise Unsupported(unknown[0])
    name = name_field(body, "model", legacy="name")
    stream = body.get("stream", True)
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean", param="stream")
    insecure = body.get("insecure")
    if insecure is not None and not isinstance(insecure, bool):
        raise BadRequest("'insecure' must be a boolean", param="insecure")
    if insecure:
        raise Unsupported("insecure", "the hub is reached as HF_ENDPOINT says")
    wanted = HubName.parse(name)
    if wanted is None:
        raise BadRequest(
            f"model '{name}' cannot be pulled: only Hugging Face models can, as "
            "hf.co/org/repo[:QUANT]",
            param="model",
        )
    try:
        HubSource.parse("model", wanted.spec)
    except HubError as exc:
        raise BadRequest(str(exc), param="model") from None
    job = _start(request, wanted)
    if stream is False:
        try:
            await asyncio.shield(job.task)
        except HubError as exc:
            raise _error_of(exc) from None
        except HubModelError as exc:
            raise BadRequest(str(exc), param="model") from None
        return {"status": "success"}
    return StreamingResponse(_stream(job), media_type="application/x-ndjson")


def _start(request: Request, wanted: HubName) -> Pull:
    state = request.app.state
    pulls: Pulls = state.pulls
    hub_models: HubModels = state.hub_models
    cache_dir = state.settings.hub.cache_dir
    return pulls.start(wanted, lambda job: _run(job, pulls, hub_models, cache_dir))


async def _run(job: Pull, pulls: Pulls, hub_models: HubModels, cache_dir: str) -> ServedModel:
    source = HubSource.parse("model", job.name.spec, cache_dir=cache_dir)
    # The pulls' own threads (server/models/pulls.py), never asyncio's default pool.
    loop = asyncio.get_running_loop()
    room = pulls.room_check(job.name.name)
    path = await loop.run_in_executor(pulls.executor, _download, job, source, room)
    requested = job.name.name
    return hub_models.register(source.repo, path, also=requested)


def _download(job: Pull, source: HubSource, room: Callable[[str, int], None]) -> str:
    """On a pull thread: the listing (for the digest and size), then the file (once
    `room` has found space for it)."""
    with contextlib.suppress(Exception):  # the hub out of reach: fetch decides (cache)
        job.digest, job.total = _manifest(source)

    def report(fraction: float) -> None:
        job.completed = int(fraction * job.total)
        job.verifying = fraction >= 1.0  # hub.fetch checks the sha256 after the last byte

    return hub.fetch(source, report, before_download=room)


def _manifest(source: HubSource) -> tuple[str, int]:
    from huggingface_hub import HfApi

    info = HfApi().model_info(source.repo, revision=source.revision or None,
                              files_metadata=True)  # fmt: skip
    siblings = {s.rfilename: s for s in info.siblings or []}
    chosen = siblings[hub.choose_file(source, list(siblings))]
    sha = chosen.lfs.sha256 if chosen.lfs is not None else ""
    return f"sha256:{sha}" if sha else "", int(chosen.size or 0)


async def _stream(job: Pull) -> AsyncIterator[bytes]:
    yield _line({"status": "pulling manifest"})
    last: dict[str, Any] | None = None
    while True:
        done = job.task.done()
        if job.digest and (now := job.progress()) != last:
            yield _line(now)
            last = now
        if done:
            break
        await asyncio.wait({job.task}, timeout=_POLL_S)
    error = job.task.exception()
    if error is not None:
        message = str(error) if isinstance(error, HubError | HubModelError) else (
            f"pull failed: {type(error).__name__}")  # fmt: skip
        yield _line({"error": message})
        return
    yield _line({"status": "verifying sha256 digest"})
    yield _line({"status": f"serving as {ollama_name(job.task.result())}"})
    yield _line({"status": "success"})


def _line(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj) + "\n").encode()


def _error_of(exc: HubError) -> APIError:
    """A hub failure's status: 404 when the repository or file is not there, 400 when
    the name does not pick one file, 507 when it does not fit, 502 when the download
    failed."""
    text = str(exc)
    if isinstance(exc, hub.NoRoom):
        return InsufficientStorage(text, param="model", code="insufficient_storage")
    if "not found" in text or "no GGUF" in text:
        return NotFound(text, param="model")
    if "ambiguous" in text or "not supported" in text:
        return BadRequest(text, param="model")
    return BadGateway(text)
