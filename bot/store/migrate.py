"""Schema migrations (Alembic) run from inside opsbot's event loop.

``opsbot db upgrade`` and :meth:`bot.store.Store.open` call :func:`upgrade`. The revision scripts
live in the ``migrations`` package, found through its import path, so an installed opsbot finds
them wherever it is started from. Alembic itself is synchronous: it gets the synchronous face of
an async connection through ``AsyncConnection.run_sync``, so no second event loop is needed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

import migrations
from bot.config import StoreSettings, mask_url
from bot.store.db import StoreError, create_engine, describe_cause, unreachable

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Any constant works: it only has to be the same in every replica so that two replicas starting
# together take turns instead of both creating the tables.
_PG_MIGRATION_LOCK = 0x6F7073626F74  # "opsbot"


def alembic_config() -> Config:
    """The Alembic configuration, built in code and pointing at the installed ``migrations`` package."""
    config = Config()
    # __path__, not __file__: an editable install made before migrations/__init__.py existed maps
    # the folder as a namespace package, which has no __file__.
    config.set_main_option("script_location", str(Path(next(iter(migrations.__path__)))))
    return config


def head_revision() -> str:
    """The newest revision the installed code knows."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


async def upgrade(url: str, settings: StoreSettings | None = None, revision: str = "head") -> str | None:
    """Migrate the database at ``url`` up to ``revision``; return the revision it is at afterwards.

    Each revision applied is logged at INFO. Raises :class:`StoreError` (one line) when the
    database cannot be reached or a migration fails.
    """
    engine = create_engine(url, settings or StoreSettings())
    try:
        return await upgrade_engine(engine, revision)
    finally:
        await engine.dispose()


async def downgrade(url: str, revision: str, settings: StoreSettings | None = None) -> str | None:
    """Migrate the database at ``url`` down to ``revision`` (``"base"`` drops every opsbot table)."""
    engine = create_engine(url, settings or StoreSettings())
    try:
        return await _run(engine, lambda conn, cfg: _migrate(conn, cfg, revision, up=False))
    finally:
        await engine.dispose()


async def current(url: str, settings: StoreSettings | None = None) -> str | None:
    """The revision the database at ``url`` is at (``None``: no opsbot tables yet)."""
    engine = create_engine(url, settings or StoreSettings())
    try:
        return await _run(engine, lambda conn, _cfg: revision_of(conn))
    finally:
        await engine.dispose()


async def upgrade_engine(engine: AsyncEngine, revision: str = "head") -> str | None:
    """:func:`upgrade` on an engine the caller owns (the store's own)."""
    return await _run(engine, lambda conn, cfg: _migrate(conn, cfg, revision, up=True))


async def _run(engine: AsyncEngine, work: Callable[[Connection, Config], T]) -> T:
    try:
        conn = await engine.connect()
    except Exception as error:
        raise unreachable(engine.url, error) from None
    try:
        async with conn.begin():
            if conn.dialect.name == "postgresql":
                await conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK})
            return await conn.run_sync(work, alembic_config())
    except StoreError:
        raise
    except Exception as error:
        shown = mask_url(engine.url.render_as_string(hide_password=False))
        raise StoreError(f"migrating the database {shown} failed: {describe_cause(error)}") from error
    finally:
        await conn.close()


def revision_of(conn: Connection) -> str | None:
    """The revision a (synchronous) connection's database is at; ``None`` before the first upgrade."""
    return MigrationContext.configure(conn).get_current_revision()


def _migrate(conn: Connection, config: Config, revision: str, *, up: bool) -> str | None:
    where = conn.engine.url.render_as_string(hide_password=True)
    before = revision_of(conn)
    applied: list[str] = []

    def on_version_apply(*, step: Any, **_kw: Any) -> None:
        name = step.up_revision_id
        applied.append(name)
        logger.info(
            "database %s: %s %s (%s)",
            where,
            "applied migration" if step.is_upgrade else "reverted migration",
            name,
            _summary(step),
        )

    config.attributes["connection"] = conn
    config.attributes["on_version_apply"] = on_version_apply
    if up:
        command.upgrade(config, revision)
    else:
        command.downgrade(config, revision)
    after = revision_of(conn)
    if not applied:
        logger.info("database %s: already at revision %s", where, after or "base")
    elif before != after:
        logger.info("database %s: now at revision %s (was %s)", where, after or "base", before or "base")
    return after


def _summary(step: Any) -> str:
    script = getattr(step, "up_revision", None)
    doc = str(getattr(script, "doc", "") or "")
    return doc.splitlines()[0] if doc else ""
