"""Ollama's /api/* routes (NDJSON): chat, generate, embed, embeddings, show (`router`),
version, tags, ps, delete, copy (`models`) and pull (`pull`)."""

from functools import partial
from operator import methodcaller

from server.api.ollama import models, pull
from server.api.ollama.router import router
from server.http.apis import ApiSpec
from server.models.served import requested_model

# Its errors as {"error": "..."}; its model names Ollama's way (`name:tag`, any case).
API = ApiSpec("ollama", routers=(router, models.router, pull.router), prefixes=("/api/",),
              error_body=methodcaller("ollama_body"),
              model_names=partial(requested_model, ollama=True))  # fmt: skip
