"""Fixtures of the store tests: fast retry settings, a SQLite file, PostgreSQL databases."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fixtures_pg import pg_url  # noqa: F401  (re-exported fixture)

from bot.config import StoreSettings
from bot.store import Store


@pytest.fixture
def store_settings() -> StoreSettings:
    """Retry delays and timeouts small enough that outage tests take a second, not minutes."""
    return StoreSettings(retry_initial_s=0.02, retry_max_s=0.2, connect_timeout_s=2.0, busy_timeout_ms=2000)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A SQLite file in a folder that does not exist yet (the store creates it)."""
    return f"sqlite+aiosqlite:///{tmp_path / 'data' / 'opsbot.db'}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, sqlite_url: str) -> str:
    """The same test on a SQLite file and on a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return sqlite_url
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
async def store(db_url: str, store_settings: StoreSettings) -> AsyncIterator[Store]:
    """An open store on ``db_url``, closed after the test."""
    opened = await Store.open(db_url, store_settings)
    try:
        yield opened
    finally:
        await opened.close(flush_timeout_s=5)
