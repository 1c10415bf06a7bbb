"""Engine creation: SQLite (aiosqlite) tuned for a bot, PostgreSQL (asyncpg) for several replicas.

Errors::

    StoreError            one readable line: which database (password masked) and why
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from sqlalchemy import event, exc, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.ext.asyncio import create_async_engine as _create_async_engine

from bot.config import StoreSettings, mask_url
from bot.errors import OpsbotError

logger = logging.getLogger(__name__)


class StoreError(OpsbotError):
    """The database cannot be used; the message is one line naming the (masked) URL and the cause."""


def describe_cause(error: BaseException) -> str:
    """``ExceptionName: message`` on one line, without SQLAlchemy's background links and SQL echo."""
    if isinstance(error, exc.DBAPIError) and error.orig is not None:
        error = error.orig
    message = " ".join(str(error).split()) or "no detail"
    return f"{type(error).__name__}: {message}"


def unreachable(url: str | URL, error: BaseException) -> StoreError:
    """The :class:`StoreError` for a database that cannot be reached or used."""
    shown = mask_url(url if isinstance(url, str) else url.render_as_string(hide_password=False))
    return StoreError(
        f"cannot use the database {shown}: {describe_cause(error)}. "
        "Fix: check store.url (OPSBOT_STORE__URL) and that the database server is running"
    )


def is_row_error(error: BaseException) -> bool:
    """True when the database refused the data itself (retrying the same rows cannot succeed).

    Everything else (refused or reset connections, timeouts, a locked SQLite file) is treated as
    transient and retried with backoff.
    """
    if isinstance(error, exc.IntegrityError | exc.DataError):
        return True
    # A value the driver cannot encode (a lone surrogate reaching sqlite3 / asyncpg) or the server
    # refuses as data (PostgreSQL SQLSTATE class 22 / 23, e.g. 22021 for a NUL in text, which
    # SQLAlchemy's asyncpg adapter wraps as a plain ``Error``) fails the same way on every retry:
    # wrapped or not, it is the row's fault, not the connection's.
    cause: BaseException | None = error
    for _ in range(8):  # the chain is short: SQLAlchemy's wrapper, the driver's error, its cause
        if cause is None:
            return False
        if isinstance(cause, UnicodeError):
            return True
        code = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
        if isinstance(code, str) and code[:2] in ("22", "23"):
            return True
        cause = cause.__cause__ or getattr(cause, "orig", None)
    return False


class DriverLogFilter(logging.Filter):
    """Keeps stored values out of the database libraries' DEBUG lines.

    ``create_engine(hide_parameters=True)`` hides SQLAlchemy's bound parameters, but two more
    places print message text when their loggers are at DEBUG: aiosqlite logs every call it runs
    on its thread *with the call's arguments* (the SQL and its parameters), and SQLAlchemy's
    ``echo="debug"`` logs every result row. The first become the call's name only, the rows a
    count-free placeholder; the statements themselves are still logged.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite a record that would carry values; never drops a record."""
        if record.name == "aiosqlite" and record.args:
            args = record.args if isinstance(record.args, tuple) else (record.args,)
            record.args = tuple(_call_name(arg) for arg in args)
        elif isinstance(record.msg, str) and record.msg.startswith("Row ") and record.args:
            record.msg, record.args = "Row [values hidden]", None
        return True


def _call_name(call: object) -> str:
    """``execute`` for ``functools.partial(<sqlite3.Cursor.execute>, sql, params)``; exceptions as text."""
    if isinstance(call, BaseException):
        return describe_cause(call)
    func = getattr(call, "func", call)
    return str(getattr(func, "__name__", type(func).__name__))


_DRIVER_LOG_FILTER = DriverLogFilter()
"""One instance, so attaching it again (every engine created) is a no-op (addFilter skips a known one)."""


def _guard_driver_logs() -> None:
    # Logger filters see only records of that exact logger: the two that print values.
    for name in ("aiosqlite", "sqlalchemy.engine.Engine"):
        logging.getLogger(name).addFilter(_DRIVER_LOG_FILTER)


def create_engine(url: str, settings: StoreSettings) -> AsyncEngine:
    """An :class:`AsyncEngine` for ``url``, configured per backend.

    SQLite gets WAL (readers never block the writer), ``synchronous=NORMAL``, ``busy_timeout`` and
    ``foreign_keys=ON`` on every connection, and its parent folder is created. PostgreSQL (asyncpg)
    gets a connect timeout and ``pool_pre_ping`` so connections killed during an outage are replaced,
    not reused.
    Nothing connects here; :class:`StoreError` is raised for a URL that cannot even be parsed.
    """
    try:
        parsed = make_url(url)
    except Exception as error:  # make_url raises ArgumentError or ValueError
        raise unreachable(url, error) from None
    backend = parsed.get_backend_name()
    _guard_driver_logs()
    # Bound parameters carry message text: never in SQLAlchemy's echo / DEBUG lines nor in the
    # text of its exceptions ("[SQL parameters hidden due to hide_parameters=True]" instead).
    kwargs: dict[str, Any] = {"hide_parameters": True}
    if backend == "sqlite":
        database = parsed.database or ""
        if database and database != ":memory:" and not database.startswith("file:"):
            try:
                Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise unreachable(url, error) from None
        kwargs["connect_args"] = {"timeout": settings.busy_timeout_ms / 1000.0}
    elif backend == "postgresql":
        kwargs["pool_pre_ping"] = True
        kwargs["connect_args"] = {"timeout": settings.connect_timeout_s}
    try:
        engine = _create_async_engine(parsed, **kwargs)
    except Exception as error:  # unknown driver, bad arguments
        raise unreachable(url, error) from None
    if backend == "sqlite":
        _tune_sqlite(engine, settings, in_memory=not parsed.database or parsed.database == ":memory:")
    return engine


def _tune_sqlite(engine: AsyncEngine, settings: StoreSettings, *, in_memory: bool) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # The sqlite3 module's own transaction handling never wraps DDL in a transaction (a failed
        # migration would leave half its tables); turn it off and emit BEGIN ourselves below.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            if not in_memory:  # an in-memory database has no journal file to switch
                cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA busy_timeout={int(settings.busy_timeout_ms)}")
            cursor.execute("PRAGMA foreign_keys=ON")
            # With WAL, NORMAL syncs at checkpoints instead of on every commit: the database stays
            # consistent through a power cut, which may lose only the last commits (a claim, a row).
            cursor.execute("PRAGMA synchronous=NORMAL")
        finally:
            cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN")


async def check_connection(engine: AsyncEngine, timeout_s: float | None = None) -> None:
    """Run ``SELECT 1``; raise :class:`StoreError` naming the database when it fails."""

    try:
        async with asyncio.timeout(timeout_s), engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
    except Exception as error:
        raise unreachable(engine.url, error) from None
