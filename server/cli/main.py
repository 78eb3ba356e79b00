"""`kvserve` / `python -m server`: parse flags, load settings, run uvicorn (one worker)."""

from __future__ import annotations

import argparse
import json
import sys

from server.cli import manage
from server.config.tree import LOG_LEVELS, ConfigError, disk_dir_problem, load_settings

# flag -> "section.key" ("model.*" needs a single model; "engine.*" applies to every model)
_FLAGS = {
    "host": "server.host",
    "port": "server.port",
    "cors_origin": "server.cors_origins",
    "shutdown_grace": "server.shutdown_grace_s",
    "api_key": "auth.api_keys",
    "log_level": "logging.level",
    "log_json": "logging.json",
    "model": "model.path",
    "model_id": "model.id",
    "hf_repo": "model.hf_repo",
    "chat_template": "model.chat_template",
    "n_ctx": "engine.n_ctx",
    "parallel": "engine.n_seq_max",
    "threads": "engine.n_threads",
    "max_queue": "engine.max_queue",
    "no_disk_cache": "cache.disk_dir",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="kvserve",
        description="OpenAI-compatible server on llama.cpp",
        epilog="model commands (a client of a running server): kvserve pull|ls|ps|rm|run --help",
    )
    p.add_argument("--config", help="TOML configuration file")
    p.add_argument(
        "--print-config", action="store_true", help="print the effective configuration and exit"
    )
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--cors-origin", action="append", help="allowed CORS origin (repeatable)")
    p.add_argument("--shutdown-grace", type=float, help="seconds in-flight requests get on SIGTERM")
    p.add_argument("--api-key", action="append", help="accepted API key (repeatable)")
    p.add_argument("--log-level", choices=list(LOG_LEVELS))
    p.add_argument("--log-json", action="store_true", default=None, help="log lines as JSON")
    p.add_argument("--model", help="GGUF file (default: the bundled SmolLM2-135M-Instruct)")
    p.add_argument("--model-id", help="the model name clients send")
    p.add_argument("--hf-repo", help="fetch the GGUF from a Hugging Face hub: org/name[:QUANT]")
    p.add_argument("--chat-template", help="Jinja chat template, inline or a file path")
    p.add_argument("--n-ctx", type=int, help="context of one sequence, in tokens")
    p.add_argument("--parallel", type=int, help="slots: sequences decoded together")
    p.add_argument("--threads", type=int, help="CPU threads (0: all cores)")
    p.add_argument("--max-queue", type=int, help="requests that may wait for a slot")
    p.add_argument(
        "--no-disk-cache",
        action="store_const",
        const="",
        help='no disk tier (cache.disk_dir = ""): the prefix cache lives in RAM only',
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in manage.NAMES:  # kvserve pull|ls|ps|rm|run: a client
        return manage.main(argv)
    if argv and argv[0] == "serve":  # `kvserve serve [flags]` is bare `kvserve [flags]`
        argv = argv[1:]
    args = parse_args(argv)
    overrides = {}
    for flag, dotted in _FLAGS.items():
        value = getattr(args, flag)
        if value is not None:
            overrides[dotted] = value
    try:
        flag_names = {dotted: "--" + flag.replace("_", "-") for flag, dotted in _FLAGS.items()}
        settings = load_settings(args.config, overrides=overrides, flag_names=flag_names)
    except ConfigError as exc:
        print(f"kvserve: configuration error: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(json.dumps(settings.masked(), indent=2))
        return 0

    # The resolved directory ("auto" is the user's cache directory), not the raw value:
    # probing "auto" created ./auto wherever kvserve started (issue 17).
    problem = disk_dir_problem(settings.cache.disk_path) if settings.cache.enabled else None
    if problem is not None:
        # Exit rather than serve with the disk tier off or the model failed: a restart
        # would silently come up cold, and every answer would be 500 (issue 9).
        print(f"kvserve: cache.disk_dir is not usable: {problem}", file=sys.stderr)
        return 2

    # Here, not at the top: the server and llama.cpp load only to serve, so --help,
    # --print-config and the model commands start fast (seconds, on a busy machine).
    from server.process.serve import serve
    from server.telemetry.logs import setup_logging

    setup_logging(settings.logging)
    return serve(settings)


if __name__ == "__main__":
    sys.exit(main())
