"""One package per API the server speaks, each with its router, its request models
(`protocol`) and its serving code on the shared core (`server/serving/`):

- `chat`: OpenAI Chat Completions (and its MCP variant, `chat.mcp`).
- `completions`: OpenAI legacy Completions.
- `embeddings`: OpenAI Embeddings.
- `responses`: OpenAI Responses (input, output items, the stored responses, MCP).
- `messages`: Anthropic Messages (and its MCP variant).
- `ollama`: Ollama's /api/* (NDJSON): chat, generate, embed, show, the model list, pull.
- `kvserve`: the server's own routes: health, status, models, sessions, cache, tokenize,
  /metrics, the API's description and the page at `/`.

`common` holds the request models several APIs share. An API package never imports
another API's package (tests/test_layering.py).
"""
