"""Fixtures of the store tests: fast retry settings, a SQLite file, PostgreSQL databases."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from fixtures_pg import pg_url  # noqa: F401  (the root conftest may import it too)
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import create_async_engine

from bot.config import StoreSettings
from bot.store import Store


@pytest.fixture
def store_settings() -> StoreSettings:
    """Retry delays and timeouts small enough that outage tests take a second, not minutes."""
    return StoreSettings(retry={"initial_s": 0.02, "max_s": 0.2}, connect_timeout_s=2.0, busy_timeout_ms=2000)


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


# Helpers are handed out as fixtures so the test modules need no import path of their own.
async def _wait_until(check: Callable[[], Awaitable[bool]], timeout_s: float = 20.0, what: str = "") -> None:
    """Poll ``check`` until it is true; fail after ``timeout_s``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what or check}")
        await asyncio.sleep(0.02)


async def _drained(store: Store) -> None:
    """Wait until the store's write buffer is empty."""

    async def empty() -> bool:
        return store.buffered == 0

    await _wait_until(empty, what="the write buffer to drain")


async def _count_rows(url: str, table: str) -> int:
    """Rows in ``table``, read over a connection of its own (not the store's)."""
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            return int(await conn.scalar(select(func.count()).select_from(text(table))) or 0)
    finally:
        await engine.dispose()


@pytest.fixture
def wait_until() -> Callable[..., Awaitable[None]]:
    """``await wait_until(check, timeout_s=20, what="...")``: poll an async check with a deadline."""
    return _wait_until


@pytest.fixture
def drained() -> Callable[[Store], Awaitable[None]]:
    """``await drained(store)``: wait until the store's write buffer is empty."""
    return _drained


@pytest.fixture
def count_rows() -> Callable[[str, str], Awaitable[int]]:
    """``await count_rows(url, table)``: rows in a table, over a connection of its own."""
    return _count_rows
