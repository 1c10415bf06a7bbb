"""Logging setup: one handler on the root logger; every record is redacted and carries the id of the
request it belongs to (``request_id``, from :mod:`inference.context`'s contextvar) in text and JSON."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bot.redact import RedactingFilter
from inference.context import request_id_var, request_scope

__all__ = [
    "JsonFormatter",
    "RequestIdFilter",
    "StderrHandler",
    "TextFormatter",
    "request_scope",
    "setup_logging",
]

_TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
# Structured fields the pipeline attaches with ``extra=``; copied into JSON lines when present.
_FIELDS = ("request_id", "platform", "channel", "thread")


class RequestIdFilter(logging.Filter):
    """Stamps every record with the current request's id (``record.request_id``; unset outside one).

    A handler filter, like :class:`RedactingFilter`, so third-party libraries' lines are stamped too.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Add ``request_id`` unless the caller passed one explicitly; never drops a record."""
        if getattr(record, "request_id", None) is None:
            record.request_id = request_id_var.get()
        return True


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message [request_id=...]``: the request id appended where there is one."""

    def __init__(self) -> None:
        super().__init__(_TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        request_id = getattr(record, "request_id", None)
        return f"{line} [request_id={request_id}]" if request_id else line


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
            if getattr(record, name, None) is not None:
                entry[name] = getattr(record, name)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record comes, not what it was at setup: a live
    rich display (``opsbot analyze``'s progress bar) swaps in a proxy that prints each line above
    the bar, so log lines never break it."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:  # logging.StreamHandler.__init__ sets it: nothing to keep
        pass


class _FileHandler(logging.FileHandler):
    """Appends to a file that is made, folder and all, only when the first record comes: a command
    that fails before it logs (``opsbot analyze`` on a missing input) leaves no empty folder."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, encoding="utf-8", delay=True)

    def _open(self) -> Any:
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()


def setup_logging(
    level: str = "INFO",
    *,
    as_json: bool = False,
    stream: object = None,
    path: Path | None = None,
    terminal_level: str | None = None,
) -> None:
    """Send all logs to stderr (or ``stream``, or the file at ``path``, appended), redacted; quiet the
    chattiest libraries. ``terminal_level`` (with ``path``): records from that level up are shown on
    stderr too (a batch command's warnings stay in sight while its progress lines hold the terminal)."""
    handlers: list[logging.Handler] = []
    if path is not None:
        handlers.append(_FileHandler(path))
        if terminal_level is not None:
            terminal = StderrHandler()
            terminal.setLevel(terminal_level)
            handlers.append(terminal)
    elif stream is not None:
        handlers.append(logging.StreamHandler(stream))  # type: ignore[call-overload]
    else:
        handlers.append(StderrHandler())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()  # a file handler of an earlier setup (a second command in one process)
    for handler in handlers:
        handler.setFormatter(JsonFormatter() if as_json else TextFormatter())
        handler.addFilter(RequestIdFilter())
        handler.addFilter(RedactingFilter())
        root.addHandler(handler)
    root.setLevel(level)
    for noisy in ("aiohttp.access", "urllib3", "httpx", "asyncio", "filelock", "alembic"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(level)))
