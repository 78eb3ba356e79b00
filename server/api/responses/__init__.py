"""OpenAI Responses: /v1/responses (create, retrieve, delete), with the store that lets
`previous_response_id` continue a conversation."""
