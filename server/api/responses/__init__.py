"""OpenAI Responses: /v1/responses (create, retrieve, delete), with the store that lets
`previous_response_id` continue a conversation."""

from server.api.responses.router import router
from server.http.apis import ApiSpec

API = ApiSpec("responses", routers=(router,))
