"""The served models: the registry of this process (`served`), loading and unloading on
demand (`loader`, `keep_alive`, `gate`), the hub and pulled models (`hub`, `hub_models`,
`pulls`), LoRA adapters (`lora`), GGUF headers (`gguf_header`), and who may manage them
(`management`)."""
