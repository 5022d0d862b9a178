"""A node's logs: on stderr, through the standard library's logging, as text lines or, with
``--log-format json``, one JSON object per line (docs/operations.md, "Logs").

stdout is not a log: it carries the node's lifecycle lines (the first one, ``statestore node
ID listening on ADDRESS (dht udp PORT)``, is what scripts read), node/server.py.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

__all__ = ["TEXT_FORMAT", "JsonFormatter", "setup_logging"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message"}`` and, when the record has them,
    ``exc_info`` and ``stack_info`` (the traceback as one string): one object per line, its
    newlines escaped by JSON."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False)


def setup_logging(level: str, log_format: str = "text") -> None:
    """The root logger at ``level``, writing to stderr as ``log_format`` (text or json)."""
    handler = logging.StreamHandler(sys.stderr)
    json_lines = log_format == "json"
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler])
