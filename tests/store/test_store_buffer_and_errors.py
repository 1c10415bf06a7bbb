"""The write buffer's limits and the errors a user sees for a database that cannot be used."""

from __future__ import annotations

import asyncio
import logging
import socket
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from bot.config import StoreSettings
from bot.store import RequestRecord, Store, StoreError, migrate
from bot.store.db import is_row_error


def record(i: int) -> RequestRecord:
    return RequestRecord(f"buf-{i}", "slack", "C1", "T1", "U1", "rca", "interactive", "ok")


async def test_a_full_buffer_counts_and_logs_each_dropped_kind_and_keeps_what_fit(
    sqlite_url: str,
    store_settings: StoreSettings,
    caplog: pytest.LogCaptureFixture,
    drained: Any,
    count_rows: Any,
) -> None:
    settings = store_settings.model_copy(update={"buffer_size": 5})
    store = await Store.open(sqlite_url, settings)
    dropped_before = REGISTRY.get_sample_value("opsbot_store_dropped_rows_total") or 0.0
    try:
        # None of these calls yields to the event loop, so the writer cannot drain in between:
        # the first five fit, the rest overflow.
        for i in range(8):
            await store.record_request(record(i))
        await store.record_feedback("buf-0", "slack", "U1", 1)
        assert store.buffered == 5
        assert store.dropped == 4
        assert (REGISTRY.get_sample_value("opsbot_store_dropped_rows_total") or 0.0) - dropped_before == 4
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("dropped" in w and "request row" in w for w in warnings), warnings
        assert any("dropped" in w and "feedback row" in w for w in warnings), warnings

        await drained(store)
        assert await count_rows(sqlite_url, "opsbot_requests") == 5
        assert REGISTRY.get_sample_value("opsbot_store_buffered_rows") == 0
    finally:
        await store.close()


async def test_a_row_the_database_refuses_is_skipped_without_holding_back_the_others(
    sqlite_url: str,
    store_settings: StoreSettings,
    caplog: pytest.LogCaptureFixture,
    drained: Any,
    count_rows: Any,
) -> None:
    store = await Store.open(sqlite_url, store_settings)
    try:
        await store.record_request(record(1))
        # content is NOT NULL: the database refuses this row whatever the number of retries.
        await store.append_message("slack", "C1", "T1", "user", None)  # type: ignore[arg-type]
        await store.record_request(record(2))
        await drained(store)
        assert await count_rows(sqlite_url, "opsbot_requests") == 2
        assert store.dropped == 1
        assert any(r.levelno == logging.ERROR and "message row" in r.getMessage() for r in caplog.records)
    finally:
        await store.close()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_an_unreachable_database_gives_one_clear_line_with_the_password_masked(
    store_settings: StoreSettings,
) -> None:
    url = f"postgresql+asyncpg://opsbot:s3cret-pw@127.0.0.1:{closed_port()}/opsbot"
    with pytest.raises(StoreError) as caught:
        await Store.open(url, store_settings)
    message = str(caught.value)
    assert "\n" not in message
    assert "s3cret-pw" not in message
    assert "opsbot:***@127.0.0.1" in message
    assert "Connect call failed" in message or "refused" in message.lower()
    assert caught.value.__cause__ is None and caught.value.__suppress_context__

    with pytest.raises(StoreError) as again:
        await migrate.upgrade(url, store_settings)
    assert "\n" not in str(again.value) and "s3cret-pw" not in str(again.value)


async def test_a_sqlite_path_that_cannot_be_created_gives_a_store_error(
    tmp_path: Path, store_settings: StoreSettings
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(StoreError, match="a-file"):
        await Store.open(f"sqlite+aiosqlite:///{blocker / 'sub' / 'opsbot.db'}", store_settings)


async def test_an_unsupported_url_gives_a_store_error(store_settings: StoreSettings) -> None:
    with pytest.raises(StoreError, match="cannot use the database"):
        await Store.open("nosuchdb+driver://host/db", store_settings)


@pytest.mark.postgres
async def test_a_missing_postgresql_database_names_the_cause(
    pg_url: str, store_settings: StoreSettings
) -> None:
    from sqlalchemy.engine import make_url

    url = make_url(pg_url).set(database="opsbot_no_such_db").render_as_string(hide_password=False)
    with pytest.raises(StoreError, match="opsbot_no_such_db.*does not exist"):
        await Store.open(url, store_settings)


async def test_a_value_the_driver_cannot_encode_is_a_row_error_not_an_outage(store: Store) -> None:
    # A lone surrogate (a JSON escape in a chat payload) that reached the driver fails every retry
    # alike: the buffer must skip that row, not report the database as down.
    with pytest.raises((UnicodeError, DBAPIError)) as caught:
        async with store._engine.begin() as conn:  # the driver as the buffer's writes reach it
            await conn.execute(
                text(
                    "INSERT INTO opsbot_requests (request_id, platform, scenario, lane, status, "
                    "prompt_tokens, cached_tokens, output_tokens, created_at, error) "
                    "VALUES ('u', 'slack', 'chat', 'normal', 'ok', 0, 0, 0, :at, :error)"
                ),
                {"at": datetime(2026, 12, 1, tzinfo=UTC), "error": "bad \ud800 value"},
            )
    assert is_row_error(caught.value)


async def test_an_answer_holding_a_nul_is_stored_and_does_not_hold_back_the_buffer(store: Store) -> None:
    # A model's output may hold a NUL (a random or byte-level model does): PostgreSQL text refuses it,
    # and the whole batch of 500 rows behind it used to be retried for ever.
    await store.append_message("slack", "C1", "T-nul", "assistant", "exit code \x00 137")
    await store.append_message("slack", "C1", "T-nul", "user", "and now?")
    for _ in range(200):  # the buffer writes in the background
        if store.buffered == 0:
            break
        await asyncio.sleep(0.05)
    assert store.buffered == 0
    turns = await store.thread_history("slack", "C1", "T-nul")
    assert [t.content for t in turns] == ["exit code \ufffd 137", "and now?"]


@pytest.mark.postgres
async def test_postgresql_refusing_a_nul_is_a_row_error(pg_url: str, store_settings: StoreSettings) -> None:
    store = await Store.open(pg_url, store_settings)
    try:
        with pytest.raises(DBAPIError) as caught:
            async with store._engine.begin() as conn:
                await conn.execute(
                    text(
                        "INSERT INTO opsbot_requests (request_id, platform, scenario, lane, status, "
                        "prompt_tokens, cached_tokens, output_tokens, created_at, error) "
                        "VALUES ('n', 'slack', 'chat', 'normal', 'ok', 0, 0, 0, :at, :error)"
                    ),
                    {"at": datetime(2026, 12, 1, tzinfo=UTC), "error": "bad \x00 value"},
                )
        assert is_row_error(caught.value)
    finally:
        await store.close()
