"""Logging set-up: one handler on stderr, plain text or JSON lines.

Access lines come from the "kvserve.access" logger with their fields in
`record.access`; JSON output puts those fields at the top level of the line.
llama.cpp's own log lines arrive on "kvserve.llama" (see engine/llama.py) at
`logging.llama_level`.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from server.config import LoggingSection

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


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
        return json.dumps(line, ensure_ascii=False, default=str)


def setup_logging(cfg: LoggingSection) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if cfg.json else logging.Formatter(TEXT_FORMAT))
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
