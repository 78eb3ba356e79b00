"""The codes that end a sequence on the engine's side, in `SeqOutput.error` (engine/types.py)."""

from __future__ import annotations

# Codes of the errors that end a sequence on the engine's side (in `SeqOutput.error`,
# written "<code>: <message>"): a time limit (HTTP 504), or the engine thread died and
# was rebuilt (500).
TIME_LIMIT_CODES = ("prefill_timeout", "token_timeout", "total_timeout", "decode_timeout")
ENGINE_RESTARTED = "engine_restarted"


def coded_error(code: str, message: str) -> str:
    return f"{code}: {message}"


def error_code(error: str | None) -> str | None:
    """The code of a `coded_error` text, or None."""
    head = (error or "").split(":", 1)[0]
    return head if head in (*TIME_LIMIT_CODES, ENGINE_RESTARTED) else None
