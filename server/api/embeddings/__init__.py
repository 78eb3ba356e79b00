"""OpenAI Embeddings: POST /v1/embeddings."""

from server.api.embeddings.router import router
from server.http.apis import ApiSpec

API = ApiSpec("embeddings", routers=(router,))
