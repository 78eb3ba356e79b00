"""POST /api/show (Ollama): a model's details, read from its GGUF metadata.

`details.family` is the architecture, `parameter_size` the parameter count in Ollama's
notation ("134.52M", "7.6B"), `quantization_level` the file type's name;
`model_info` carries the metadata (tokenizer arrays left out) with numbers as numbers;
`capabilities` says what kvserve does with the model: completion and tools always (a
template without native tool calls gets the generic envelope), thinking when the
template has thinking tags, embedding when the embedding context is on, insert when
the vocabulary has fill-in-the-middle tokens, vision when a projector is loaded (known
once the model has loaded: a model never loaded yet does not say it).

`modelfile`'s FROM line names the model's file (as Ollama's names its blob) for an admin
caller only (an admin key, or anyone on a server without keys): another key gets the
model's name there, which is a valid FROM as well, not the server's file system layout.
`model_info` carries the load's family probe under `kvserve.*` (server/api/kvserve/models.py).

A model that is not loaded stays so: what it said when it last loaded, or, for one never
loaded yet, what its GGUF's header says (server/models/gguf_header.py): the same fields, less
the context it will serve (`parameters`) and `embedding` (the engine's), and `insert`
from the FIM token ids the metadata names.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fastapi import Request

from chat.reasoning import has_thinking
from engine.client import EngineNotReadyError, ftype_name
from server.api.ollama.common import ollama_model
from server.api.ollama.protocol import OllamaShowRequest
from server.errors import ServerError, ServiceUnavailable, Unsupported
from server.http.deps import get_caller
from server.models.gguf_header import GgufError, read_header
from server.models.served import ServedModel, family_of

# Where Ollama's name of a general.file_type differs from llama.cpp's (engine/family.py).
OLLAMA_FTYPE_NAMES = {"MXFP4_MOE": "MXFP4"}


def quantization_level(file_type: object) -> str:
    """general.file_type in Ollama's words; a value llama.cpp does not name, as it is."""
    name = ftype_name(file_type) if isinstance(file_type, int) else None
    return str(file_type) if name is None else OLLAMA_FTYPE_NAMES.get(name, name)


def parameter_size(n: int) -> str:
    """Ollama's notation: whole numbers bare, else one decimal (B) or two (M)."""
    for unit, scale, places in (("B", 1e9, 1), ("M", 1e6, 2)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.{places}f}{unit}"
    return f"{n / 1e3:.0f}K" if n >= 1000 else str(n)


def _value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def _modified_at(path: str) -> str:
    try:
        stamp = os.path.getmtime(path)
    except OSError:
        return datetime.now(UTC).isoformat().replace("+00:00", "Z")
    return datetime.fromtimestamp(stamp, UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class _Facts:
    """What /api/show says about a model: from the loaded model, else from its file."""

    path: str
    metadata: dict[str, str]
    n_params: int
    template: str
    n_ctx: int | None  # the context it serves; None: not known until it loads
    n_ctx_train: int
    n_embd: int
    embedding: bool
    insert: bool
    vision: bool = False  # a projector is loaded: prompts may carry images
    family: dict[str, Any] | None = None  # the load's probe; None: never loaded yet


def _loaded_facts(served: ServedModel) -> _Facts:
    info = served.engine.info  # EngineNotReadyError for a model never loaded yet
    return _Facts(info.path, dict(info.metadata), info.n_params, served.template.source,
                  info.n_ctx, info.n_ctx_train, info.n_embd, bool(info.embed_n_ctx),
                  info.fim_tokens is not None, info.vision, family_of(info))  # fmt: skip


async def _file_facts(served: ServedModel) -> _Facts:
    """A model not loaded yet is not loaded for this: its GGUF's header says the rest.
    The embedding context is the engine's, known once the model has loaded."""
    if not served.path:
        raise ServiceUnavailable(
            f"the model '{served.id}' has not been fetched yet (it is, by its first load)",
            code="model_unloaded",
            headers={"Retry-After": "5"},
        )
    try:
        header = await asyncio.to_thread(read_header, served.path)
    except GgufError as exc:
        raise ServerError(f"the model's file cannot be read: {exc}") from None
    meta = header.metadata
    family = meta.get("general.architecture", "")
    return _Facts(
        served.path,
        {k: v for k, v in meta.items() if not k.startswith("tokenizer.")},
        header.n_params,
        served.template_override or meta.get("tokenizer.chat_template", ""),
        None,
        int(meta.get(f"{family}.context_length", 0) or 0),
        int(meta.get(f"{family}.embedding_length", 0) or 0),
        False,
        all(f"tokenizer.ggml.fim_{part}_token_id" in meta for part in ("pre", "suf", "mid")),
    )


async def serve_ollama_show(body: OllamaShowRequest, request: Request) -> dict[str, Any]:
    body.log_unknown("ollama.show")
    if body.verbose:
        raise Unsupported("verbose", "the tokenizer's arrays are not kept")
    served = ollama_model(request, body.model_name, require_ready=False)
    try:
        facts = _loaded_facts(served)
    except EngineNotReadyError:
        facts = await _file_facts(served)
    meta = facts.metadata
    family = meta.get("general.architecture", "")
    file_type = _value(meta.get("general.file_type", ""))
    capabilities = ["completion", "tools"]
    if has_thinking(facts.template):
        capabilities.append("thinking")
    if facts.embedding:
        capabilities.append("embedding")
    if facts.insert:
        capabilities.append("insert")
    if facts.vision:
        capabilities.append("vision")
    model_info = {k: _value(v) for k, v in meta.items()}
    model_info["general.parameter_count"] = facts.n_params
    if family:
        model_info.setdefault(f"{family}.context_length", facts.n_ctx_train)
        model_info.setdefault(f"{family}.embedding_length", facts.n_embd)
    # What the load's probe found, under kvserve's own prefix (the rest are GGUF keys).
    probe = facts.family or {}
    model_info |= {f"kvserve.{k}": v for k, v in probe.items() if v is not None}
    source = facts.path if get_caller(request).admin else served.id
    parameters = "" if facts.n_ctx is None else f"num_ctx                        {facts.n_ctx}"
    return {
        "license": meta.get("general.license", ""),
        "modelfile": f"# Served by kvserve\nFROM {source}\n",
        "parameters": parameters,
        "template": facts.template,
        "details": {
            "parent_model": "",
            "format": "gguf",
            "family": family,
            "families": [family] if family else None,
            "parameter_size": parameter_size(facts.n_params),
            "quantization_level": quantization_level(file_type),
        },
        "model_info": model_info,
        "capabilities": capabilities,
        "modified_at": _modified_at(facts.path),
    }
