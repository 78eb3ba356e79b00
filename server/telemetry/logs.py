"""Logging set-up: one handler on stderr, plain text or JSON lines.

Access lines come from the "kvserve.access" logger with their fields in
`record.access`; JSON output puts those fields at the top level of the line.
llama.cpp's own log lines arrive on "kvserve.llama" (see engine/llama.py) at
`logging.llama_level`.

Log lines carry what clients sent (paths, model names, session ids, header values): a
newline in one would write a line of the client's making (issue 28). Text lines escape
every control character (C0 with CR and LF, DEL, C1, the Unicode line and paragraph
separators, the bidirectional overrides) in the message, and indent a traceback's lines
so that none of them can pass for a line of its own; JSON lines escape the same
characters as \\u sequences (still valid JSON).
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from server.config.tree import LoggingSection

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The characters no log line may carry raw (see the module docstring).
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# JSON escapes C0 itself; the rest of _CONTROLS would stay raw with ensure_ascii=False.
_JSON_RAW = re.compile("[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """`text` with its control characters written as Python escapes ("\\n", "\\x1b")."""
    return _CONTROLS.sub(_escape, text)


class TextFormatter(logging.Formatter):
    """TEXT_FORMAT, one line per message whatever the message holds."""

    def format(self, record: logging.LogRecord) -> str:
        # logging caches a record's traceback text on it: another handler's unindented
        # one must not be reused here.
        cached = record.exc_text
        record.exc_text = None
        try:
            return super().format(record)
        finally:
            record.exc_text = cached

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        message = record.message
        record.message = escape_controls(message)
        try:
            return super().formatMessage(record)
        finally:
            record.message = message

    def formatException(self, ei: Any) -> str:  # noqa: N802
        return _indented(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:  # noqa: N802
        return _indented(super().formatStack(stack_info))


def _indented(text: str) -> str:
    """A traceback's lines, each escaped and indented: an exception's message (which may
    quote a client's input) cannot start a line that looks like a log line."""
    return "\n".join("  " + escape_controls(line) for line in text.split("\n"))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and access fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        access = getattr(record, "access", None)
        if isinstance(access, dict):
            line.update(access)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        text = json.dumps(line, ensure_ascii=False, default=str)
        return _JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def setup_logging(cfg: LoggingSection) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if cfg.json else TextFormatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(cfg.level.upper())
    logging.getLogger("kvserve.llama").setLevel(cfg.llama_level.upper())
    access_level = logging.INFO if cfg.access_log else logging.WARNING
    logging.getLogger("kvserve.access").setLevel(access_level)
    for name in ("uvicorn", "uvicorn.error"):  # uvicorn's lines through our handler
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
