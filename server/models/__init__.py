"""The served models: the registry of this process (`served`), loading and unloading on
demand (`loader`, `keep_alive`), the hub and pulled models (`hub`, `hub_models`,
`pulls`), and GGUF headers (`gguf_header`). Nothing here reads a request: who may
manage them is server/http/management.py's."""
