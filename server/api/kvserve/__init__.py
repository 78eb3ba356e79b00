"""The server's own routes: /health and /livez, /v1/status, /v1/models (and load, unload),
/v1/sessions, /v1/cache, /tokenize and /detokenize, /metrics, /openapi.json with /docs and
/redoc, and the page at `/` (its files in static/)."""
