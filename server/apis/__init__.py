"""One adapter per API on the serving core: its request model in, its shapes out.

- `chat_input` / `chat`: OpenAI Chat Completions.
- `completions`: OpenAI legacy Completions.
- `responses_input` / `responses` / `responses_stream` / `responses_store`: OpenAI Responses.
- `messages_input` / `messages`: Anthropic Messages.
- `ollama_common` / `ollama_answer` / `ollama_chat` / `ollama_generate` / `ollama_embed` /
  `ollama_show`: Ollama's /api/* inference routes (NDJSON).
"""
