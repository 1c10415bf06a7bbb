"""The store through database outages: PostgreSQL behind a TCP proxy the test controls."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from fakes.tcp_proxy import TcpProxy
from fixtures_pg import pg_base_url
from prometheus_client import REGISTRY
from sqlalchemy.engine import make_url

from bot.config import StoreSettings
from bot.store import RequestRecord, Store, migrate

pytestmark = pytest.mark.postgres


def metric(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


@pytest.fixture
async def proxy() -> AsyncIterator[TcpProxy]:
    base = pg_base_url()
    tcp = TcpProxy(base.host or "127.0.0.1", base.port or 5432)
    await tcp.start()
    try:
        yield tcp
    finally:
        await tcp.close()


@pytest.fixture
def proxied_url(pg_url: str, proxy: TcpProxy) -> str:
    """``pg_url`` with the connection going through the proxy."""
    return make_url(pg_url).set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)


def record(i: int) -> RequestRecord:
    return RequestRecord(
        f"outage-{i:03d}", "slack", "C1", "T1", "U1", "rca", "interactive", "ok", ttft_ms=float(i)
    )


@pytest.mark.parametrize("outage", ["refused", "reset"])
async def test_requests_recorded_while_postgresql_is_unreachable_all_land_after_it_returns(
    outage: str,
    pg_url: str,
    proxied_url: str,
    proxy: TcpProxy,
    store_settings: StoreSettings,
    drained: Any,
    count_rows: Any,
    wait_until: Any,
) -> None:
    await migrate.upgrade(pg_url, store_settings)
    store = await Store.open(proxied_url, store_settings, upgrade=False)
    try:
        assert await store.claim_event("slack", "before")  # a pooled connection exists and will die
        failures_before = metric("opsbot_store_write_failures_total")
        started = datetime.now(UTC)
        if outage == "refused":
            await proxy.refuse()
        else:
            await proxy.reset_connections()

        for i in range(100):
            await store.record_request(record(i))
        await store.append_message("slack", "C1", "T1", "user", "is the database down?", user="U1")
        await store.append_message("slack", "C1", "T1", "assistant", "yes", request_id="outage-000")

        async def failing() -> bool:
            return metric("opsbot_store_write_failures_total") > failures_before

        await wait_until(failing, what="a failed write attempt")
        assert metric("opsbot_store_up") == 0
        assert await store.ping() is False
        assert store.buffered >= 100

        # The reply path keeps working on what is in memory.
        assert await store.claim_event("slack", "during") is True
        assert await store.claim_event("slack", "during") is False
        assert await store.claim_event("slack", "before") is False  # remembered from before the outage
        assert [m.content for m in await store.thread_history("slack", "C1", "T1")] == [
            "is the database down?",
            "yes",
        ]
        assert await store.is_bot_thread("slack", "C1", "T1") is True
        assert len(await store.recent_ttft(started)) >= 99

        await proxy.accept()

        async def all_rows_landed() -> bool:
            return await count_rows(pg_url, "opsbot_requests") == 100

        await wait_until(all_rows_landed, timeout_s=30, what="the 100 buffered requests in PostgreSQL")
        await drained(store)
        assert store.dropped == 0
        assert await store.ping() is True
        assert metric("opsbot_store_up") == 1
        assert await count_rows(pg_url, "opsbot_thread_messages") == 2
        # The claim made in memory during the outage reached the database for the other replicas.
        other = await Store.open(pg_url, store_settings, upgrade=False)
        try:
            assert await other.claim_event("slack", "during") is False
        finally:
            await other.close()
    finally:
        await store.close(flush_timeout_s=5)


async def test_close_logs_the_rows_it_could_not_write(
    pg_url: str,
    proxied_url: str,
    proxy: TcpProxy,
    store_settings: StoreSettings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = await Store.open(proxied_url, store_settings)
    await proxy.refuse()
    for i in range(3):
        await store.record_request(record(i))
    await store.close(flush_timeout_s=0.3)
    assert any(
        r.levelno == logging.ERROR and "3 buffered rows not written" in r.getMessage() for r in caplog.records
    )


async def test_two_stores_on_one_postgresql_never_both_win_a_claim(
    pg_url: str, store_settings: StoreSettings
) -> None:
    first = await Store.open(pg_url, store_settings)
    second = await Store.open(pg_url, store_settings, upgrade=False)
    try:
        ids = [f"race-{i}" for i in range(40)]
        results = await asyncio.gather(
            *(store.claim_event("slack", event_id) for event_id in ids for store in (first, second))
        )
        # Results come in pairs (first, second) per event id: exactly one True in each pair.
        pairs = list(zip(results[0::2], results[1::2], strict=True))
        assert all(a != b for a, b in pairs), pairs
        assert sum(results) == len(ids)
    finally:
        await first.close()
        await second.close()
