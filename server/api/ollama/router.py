"""Ollama's inference routes: POST /api/chat, /api/generate, /api/embed, /api/embeddings,
/api/show (NDJSON streams; errors as {"error": "..."}; see the modules beside this one)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request

from server.api.ollama.chat import serve_ollama_chat
from server.api.ollama.embed import serve_ollama_embed, serve_ollama_embeddings
from server.api.ollama.generate import serve_ollama_generate
from server.api.ollama.protocol import (
    OllamaChatRequest,
    OllamaEmbeddingsRequest,
    OllamaEmbedRequest,
    OllamaGenerateRequest,
    OllamaShowRequest,
)
from server.api.ollama.show import serve_ollama_show
from server.http.deps import CallerDep
from server.http.lease import Lease, leased

router = APIRouter()


@router.post("/api/chat")
async def ollama_chat(
    request: Request,
    caller: CallerDep,
    lease: Annotated[Lease[OllamaChatRequest], leased(OllamaChatRequest)],
) -> Any:
    """Chat with a model (Ollama): NDJSON unless `stream` is false."""
    return await serve_ollama_chat(lease.body, request, caller)


@router.post("/api/generate")
async def ollama_generate(
    request: Request,
    caller: CallerDep,
    lease: Annotated[Lease[OllamaGenerateRequest], leased(OllamaGenerateRequest)],
) -> Any:
    """Complete a prompt (Ollama): templated, raw or fill-in-the-middle; `context` continues."""
    return await serve_ollama_generate(lease.body, request, caller)


@router.post("/api/embed")
async def ollama_embed(
    request: Request, lease: Annotated[Lease[OllamaEmbedRequest], leased(OllamaEmbedRequest)]
) -> Any:
    """Embed one input or several (Ollama)."""
    return await serve_ollama_embed(lease.body, request)


@router.post("/api/embeddings")
async def ollama_embeddings(
    request: Request,
    lease: Annotated[Lease[OllamaEmbeddingsRequest], leased(OllamaEmbeddingsRequest)],
) -> Any:
    """Embed one prompt (Ollama's older endpoint)."""
    return await serve_ollama_embeddings(lease.body, request)


@router.post("/api/show")
async def ollama_show(body: OllamaShowRequest, request: Request) -> Any:
    """A model's details from its GGUF metadata (Ollama): what its file says; it needs no
    engine, so no model is leased or loaded."""
    return await serve_ollama_show(body, request)
