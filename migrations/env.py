"""Alembic environment for opsbot.

opsbot runs migrations from inside its event loop (:mod:`bot.store.migrate`): it opens an async
connection, and hands its synchronous face (``connection.run_sync``) to Alembic through
``config.attributes["connection"]``. Only the hand-run ``alembic`` command takes the other branch,
which makes its own async engine from ``-x url=...``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from bot.store.models import Base

config = context.config
target_metadata = Base.metadata


def _configure_and_run(connection: Connection) -> None:
    options: dict[str, Any] = {
        "connection": connection,
        "target_metadata": target_metadata,
        # SQLite cannot ALTER most things: batch mode copies the table instead.
        "render_as_batch": connection.dialect.name == "sqlite",
        "compare_type": True,
    }
    on_apply = config.attributes.get("on_version_apply")
    if on_apply is not None:
        options["on_version_apply"] = on_apply
    context.configure(**options)
    with context.begin_transaction():
        context.run_migrations()


async def _run_with_own_engine(url: str) -> None:
    engine = create_async_engine(url, hide_parameters=True)  # as bot.store.db: no values in logs
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_configure_and_run)
    finally:
        await engine.dispose()


def _run() -> None:
    if context.is_offline_mode():
        url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option(
            "sqlalchemy.url"
        )
        context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure_and_run(connection)
        return
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("pass the database with: alembic -x url=sqlite+aiosqlite:///path.db ...")
    asyncio.run(_run_with_own_engine(url))


_run()
