"""OpenAI Embeddings: POST /v1/embeddings."""
