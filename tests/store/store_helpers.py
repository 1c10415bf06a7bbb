"""Helpers shared by the store tests (waiting with a deadline, reading rows directly)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import create_async_engine

from bot.store import Store


async def wait_until(check: Callable[[], Awaitable[bool]], timeout_s: float = 20.0, what: str = "") -> None:
    """Poll ``check`` until it is true; fail after ``timeout_s``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what or check}")
        await asyncio.sleep(0.02)


async def drained(store: Store) -> None:
    """Wait until the store's write buffer is empty."""

    async def empty() -> bool:
        return store.buffered == 0

    await wait_until(empty, what="the write buffer to drain")


async def count_rows(url: str, table: str) -> int:
    """Rows in ``table``, read over a connection of its own (not the store's)."""
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            return int(await conn.scalar(select(func.count()).select_from(text(table))) or 0)
    finally:
        await engine.dispose()
