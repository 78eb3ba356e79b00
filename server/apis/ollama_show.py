"""POST /api/show (Ollama): a model's details, read from its GGUF metadata.

`details.family` is the architecture, `parameter_size` the parameter count in Ollama's
notation ("134.52M", "7.6B"), `quantization_level` the file type's name;
`model_info` carries the metadata (tokenizer arrays left out) with numbers as numbers;
`capabilities` says what kvserve does with the model: completion and tools always (a
template without native tool calls gets the generic envelope), thinking when the
template has thinking tags, embedding when the embedding context is on, insert when
the vocabulary has fill-in-the-middle tokens.

`modelfile`'s FROM line names the model's file (as Ollama's names its blob) for an admin
caller only (an admin key, or anyone on a server without keys): another key gets the
model's name there, which is a valid FROM as well, not the server's file system layout.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

from fastapi import Request

from chat.reasoning import has_thinking
from server.apis.ollama_common import ollama_model
from server.deps import get_caller
from server.errors import Unsupported
from server.protocol_ollama import OllamaShowRequest
from server.routes.models import family_of

# llama.cpp's llama_ftype values (general.file_type) as Ollama names them.
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0",
    38: "MXFP4",
}  # fmt: skip


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


async def serve_ollama_show(body: OllamaShowRequest, request: Request) -> dict[str, Any]:
    body.log_unknown("ollama.show")
    if body.verbose:
        raise Unsupported("verbose", "the tokenizer's arrays are not kept")
    served = ollama_model(request, body.model_name)
    info = served.engine.info
    meta = dict(info.metadata)
    family = meta.get("general.architecture", "")
    file_type = _value(meta.get("general.file_type", ""))
    template = served.template.source
    capabilities = ["completion", "tools"]
    if has_thinking(template):
        capabilities.append("thinking")
    if info.embed_n_ctx:
        capabilities.append("embedding")
    if info.fim_tokens is not None:
        capabilities.append("insert")
    source = info.path if get_caller(request).admin else served.id
    model_info = {k: _value(v) for k, v in meta.items()}
    model_info["general.parameter_count"] = info.n_params
    if family:
        model_info.setdefault(f"{family}.context_length", info.n_ctx_train)
        model_info.setdefault(f"{family}.embedding_length", info.n_embd)
    # What the load's probe found, under kvserve's own prefix (the rest are GGUF keys).
    model_info |= {f"kvserve.{k}": v for k, v in family_of(info).items() if v is not None}
    return {
        "license": meta.get("general.license", ""),
        "modelfile": f"# Served by kvserve\nFROM {source}\n",
        "parameters": f"num_ctx                        {info.n_ctx}",
        "template": template,
        "details": {
            "parent_model": "",
            "format": "gguf",
            "family": family,
            "families": [family] if family else None,
            "parameter_size": parameter_size(info.n_params),
            "quantization_level": FILE_TYPES.get(file_type, str(file_type)),
        },
        "model_info": model_info,
        "capabilities": capabilities,
        "modified_at": _modified_at(info.path),
    }
