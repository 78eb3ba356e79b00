"""Anthropic Messages: POST /v1/messages and /v1/messages/count_tokens."""

from operator import methodcaller

from server.api.messages.router import router
from server.http.apis import ApiSpec

# Its errors in Anthropic's shape ({"type": "error", "error": {"type", "message"}}).
API = ApiSpec("messages", routers=(router,), prefixes=("/v1/messages",),
              error_body=methodcaller("anthropic_body"))  # fmt: skip
