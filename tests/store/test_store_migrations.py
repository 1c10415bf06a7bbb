"""Alembic migrations: up, down to base and up again, on a SQLite file and on PostgreSQL."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from bot.config import StoreSettings
from bot.store import Store, migrate
from bot.store.models import Base

OPSBOT_TABLES = {
    "opsbot_requests",
    "opsbot_threads",
    "opsbot_thread_messages",
    "opsbot_processed_events",
    "opsbot_alert_threads",
    "opsbot_feedback",
}


async def table_names(url: str) -> set[str]:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            return set(await conn.run_sync(lambda sync: inspect(sync).get_table_names()))
    finally:
        await engine.dispose()


async def test_migrations_go_up_down_to_base_and_up_again(db_url: str, store_settings: StoreSettings) -> None:
    head = migrate.head_revision()
    assert await migrate.current(db_url, store_settings) is None

    assert await migrate.upgrade(db_url, store_settings) == head
    assert await table_names(db_url) >= OPSBOT_TABLES
    assert await migrate.current(db_url, store_settings) == head

    assert await migrate.downgrade(db_url, "base", store_settings) is None
    assert not OPSBOT_TABLES & await table_names(db_url)
    assert await migrate.current(db_url, store_settings) is None

    assert await migrate.upgrade(db_url, store_settings) == head
    assert await table_names(db_url) >= OPSBOT_TABLES

    # And the schema is usable after the round trip.
    store = await Store.open(db_url, store_settings, upgrade=False)
    try:
        assert await store.claim_event("slack", "after-round-trip")
    finally:
        await store.close()


async def test_the_migrated_schema_matches_the_models(db_url: str, store_settings: StoreSettings) -> None:
    await migrate.upgrade(db_url, store_settings)

    def diff(sync: Connection) -> list[object]:
        context = MigrationContext.configure(sync, opts={"compare_type": True})
        return list(compare_metadata(context, Base.metadata))

    engine = create_async_engine(db_url)
    try:
        async with engine.connect() as conn:
            assert await conn.run_sync(diff) == []
    finally:
        await engine.dispose()


async def test_upgrade_logs_each_revision_it_applies_and_is_a_no_op_at_head(
    sqlite_url: str, store_settings: StoreSettings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="bot.store.migrate")
    await migrate.upgrade(sqlite_url, store_settings)
    applied = [r.getMessage() for r in caplog.records if "applied migration" in r.getMessage()]
    # One line per revision, oldest first, ending at head.
    assert applied and migrate.head_revision() in applied[-1]

    caplog.clear()
    await migrate.upgrade(sqlite_url, store_settings)
    assert any("already at revision" in r.getMessage() for r in caplog.records)
    assert not any("applied migration" in r.getMessage() for r in caplog.records)


async def test_migrations_are_found_from_any_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store_settings: StoreSettings
) -> None:
    monkeypatch.chdir(tmp_path)
    url = f"sqlite+aiosqlite:///{tmp_path / 'elsewhere.db'}"
    assert await migrate.upgrade(url, store_settings) == migrate.head_revision()
