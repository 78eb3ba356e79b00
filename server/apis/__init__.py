"""One adapter per API on the serving core: its request model in, its shapes out.

- `chat_input` / `chat`: OpenAI Chat Completions.
- `completions`: OpenAI legacy Completions.
- `responses_input` / `responses` / `responses_stream` / `responses_store`: OpenAI Responses.
- `messages_input` / `messages`: Anthropic Messages.
"""
