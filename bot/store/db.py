"""Engine creation: SQLite (aiosqlite for reads, :class:`SqliteWriter` for write transactions) tuned
for a bot, PostgreSQL (asyncpg) for several replicas.

Errors::

    StoreError            one readable line: which database (password masked) and why
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy
from sqlalchemy import event, exc, text
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.ext.asyncio import create_async_engine as _create_async_engine

from bot.config import StoreSettings, mask_url
from bot.errors import OpsbotError

logger = logging.getLogger(__name__)

T = TypeVar("T")


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
        _tune_sqlite(engine.sync_engine, settings, in_memory=not _is_sqlite_file(parsed))
    return engine


def _is_sqlite_file(url: URL) -> bool:
    """A SQLite URL naming a file (not ``:memory:`` nor a ``mode=memory`` URI)."""
    database = url.database or ""
    in_memory = url.query.get("mode") == "memory" or "mode=memory" in database
    return database not in ("", ":memory:") and not in_memory


def _tune_sqlite(
    engine: sqlalchemy.Engine, settings: StoreSettings, *, in_memory: bool, begin: str = "BEGIN"
) -> None:
    @event.listens_for(engine, "connect")
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

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql(begin)


class SqliteWriter:
    """Runs each write transaction on a SQLite file whole, on one thread of its own: one hop from
    the event loop per transaction.

    Why: through aiosqlite every statement of a transaction (BEGIN, each write, COMMIT) is a round
    trip between the event loop and aiosqlite's thread, and SQLite's one write lock is held from the
    first write to the COMMIT, so across every event-loop turn in between. With several bot
    processes on one file (``workers = N``) a busy loop held the lock for tens of ms while the other
    processes waited it out in SQLite's busy handler (sleeps of 1, 2, 5, 10, 15, 20 ... ms): a
    burst's claims went out in rounds about 20 ms apart (H200, 2026-12-03, run 5). Here the lock is
    held only while SQLite works. ``BEGIN IMMEDIATE`` takes it up front, so a transaction that reads
    before it writes never fails on a stale snapshot (``database is locked`` with no wait at all).
    Reads stay on the async engine (WAL: readers never wait for the writer).
    """

    def __init__(self, url: URL, settings: StoreSettings) -> None:
        """Open nothing yet: the connection is made on the writer's thread by the first transaction."""
        self.engine = sqlalchemy.create_engine(
            url.set(drivername="sqlite"),  # the standard library's sqlite3, as aiosqlite uses
            hide_parameters=True,
            connect_args={"timeout": settings.busy_timeout_ms / 1000.0},
        )
        """The synchronous engine (the standard library's sqlite3 driver) the transactions run on."""
        _tune_sqlite(self.engine, settings, in_memory=False, begin="BEGIN IMMEDIATE")
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="opsbot-sqlite-writer")
        self._closed = False

    async def run(self, work: Callable[[Connection], T]) -> T:
        """``work(connection)`` in one transaction on the writer's thread (committed when it
        returns, rolled back when it raises); what it returns. A caller cancelled meanwhile leaves
        the transaction to finish there."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, self._transact, work)

    def _transact(self, work: Callable[[Connection], T]) -> T:
        with self.engine.begin() as conn:
            return work(conn)

    async def dispose(self) -> None:
        """Close the writer's connection (on its own thread, after the transactions queued) and
        stop the thread; a second call does nothing (a store may be closed twice)."""
        if self._closed:
            return
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(self._thread, self.engine.dispose)
        self._thread.shutdown(wait=False)


def sqlite_writer(engine: AsyncEngine, settings: StoreSettings) -> SqliteWriter | None:
    """The :class:`SqliteWriter` for ``engine``'s SQLite file; ``None`` for an in-memory SQLite
    database (another connection would see another database) and for PostgreSQL (asyncpg sends a
    transaction's statements without a thread in between)."""
    if engine.dialect.name != "sqlite" or not _is_sqlite_file(engine.url):
        return None
    return SqliteWriter(engine.url, settings)


async def check_connection(engine: AsyncEngine, timeout_s: float | None = None) -> None:
    """Run ``SELECT 1``; raise :class:`StoreError` naming the database when it fails."""

    try:
        async with asyncio.timeout(timeout_s), engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
    except Exception as error:
        raise unreachable(engine.url, error) from None
