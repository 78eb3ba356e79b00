"""`kvserve` / `python -m server`: parse flags, load settings, run uvicorn (one worker)."""

from __future__ import annotations

import argparse
import json
import logging
import sys

import uvicorn

from server.config import ConfigError, load_settings

# flag -> "section.key"
_FLAGS = {
    "host": "server.host",
    "port": "server.port",
    "api_key": "server.api_keys",
    "cors_origin": "server.cors_origins",
    "log_level": "server.log_level",
    "model": "model.path",
    "model_id": "model.id",
    "chat_template": "model.chat_template",
    "n_ctx": "model.n_ctx",
    "parallel": "model.n_seq_max",
    "threads": "model.n_threads",
    "max_queue": "model.max_queue",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvserve", description="OpenAI-compatible server on llama.cpp")
    p.add_argument("--config", help="TOML configuration file")
    p.add_argument(
        "--print-config", action="store_true", help="print the effective configuration and exit"
    )
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--api-key", action="append", help="accepted API key (repeatable)")
    p.add_argument("--cors-origin", action="append", help="allowed CORS origin (repeatable)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.add_argument("--model", help="GGUF file (default: the bundled SmolLM2-135M-Instruct)")
    p.add_argument("--model-id", help="the model name clients send")
    p.add_argument("--chat-template", help="Jinja chat template, inline or a file path")
    p.add_argument("--n-ctx", type=int, help="KV cache cells shared by all slots")
    p.add_argument("--parallel", type=int, help="slots: sequences decoded together")
    p.add_argument("--threads", type=int, help="CPU threads (0: all cores)")
    p.add_argument("--max-queue", type=int, help="requests that may wait for a slot")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    overrides = {}
    for flag, dotted in _FLAGS.items():
        value = getattr(args, flag)
        if value is not None:
            overrides[dotted] = value
    try:
        settings = load_settings(args.config, overrides=overrides)
    except ConfigError as exc:
        print(f"kvserve: configuration error: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(json.dumps(settings.masked(), indent=2))
        return 0
    level = settings.server.log_level.upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kvserve.llama").setLevel(max(logging.WARNING, logging.getLevelName(level)))

    from server.app import create_app  # after logging is set up

    app = create_app(settings)
    uvicorn.run(
        app,
        host=settings.server.host,
        port=settings.server.port,
        workers=1,  # the engine lives in this process: scale with replicas, not workers
        log_level=settings.server.log_level,
        access_log=False,
        timeout_graceful_shutdown=10,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
