"""Logging setup: one handler on the root logger, every record redacted before it is written."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

from bot.context.redact import RedactingFilter

_TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
# Structured fields the pipeline attaches with ``extra=``; copied into JSON lines when present.
_FIELDS = ("request_id", "platform", "channel", "thread")


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in _FIELDS:
            if hasattr(record, name):
                entry[name] = getattr(record, name)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def setup_logging(level: str = "INFO", *, as_json: bool = False, stream: object = None) -> None:
    """Send all logs to stderr (or ``stream``), redacted; quiet the chattiest libraries."""
    handler = logging.StreamHandler(stream or sys.stderr)  # type: ignore[arg-type]
    handler.setFormatter(JsonFormatter() if as_json else logging.Formatter(_TEXT_FORMAT))
    handler.addFilter(RedactingFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for noisy in ("aiohttp.access", "urllib3", "httpx", "asyncio", "filelock", "alembic"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(level)))
