"""OpenAI legacy Completions: POST /v1/completions."""

from server.api.completions.router import router
from server.http.apis import ApiSpec

API = ApiSpec("completions", routers=(router,))
