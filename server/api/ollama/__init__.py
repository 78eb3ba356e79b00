"""Ollama's /api/* routes (NDJSON): chat, generate, embed, embeddings, show (`router`),
version, tags, ps, delete, copy (`models`) and pull (`pull`)."""
