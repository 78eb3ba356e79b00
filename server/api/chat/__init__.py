"""OpenAI Chat Completions: POST /v1/chat/completions (and llama-server's /apply-template)."""

from server.api.chat.router import router
from server.http.apis import ApiSpec

API = ApiSpec("chat", routers=(router,))
