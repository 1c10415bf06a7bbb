"""``Store.requests_between``: the rows ``opsbot stats`` and ``/rca status`` compute from, on a SQLite
file and on PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from bot.store import RequestRecord, Store


def row(request_id: str, created_at: datetime, **fields: Any) -> RequestRecord:
    values: dict[str, Any] = {
        "platform": "slack",
        "channel": "C1",
        "thread_id": "1700000000.000100",
        "user": "U1",
        "scenario": "root_cause",
        "lane": "urgent",
        "status": "ok",
        "model": "/models/m",
        "prompt_tokens": 100,
        "cached_tokens": 60,
        "output_tokens": 20,
        "ttft_ms": 120.0,
        "tpot_ms": 12.0,
        "queue_ms": 3.0,
        "e2e_ms": 900.0,
        "created_at": created_at,
    }
    values.update(fields)
    return RequestRecord(request_id=request_id, **values)


async def test_the_window_is_half_open_oldest_first_with_every_statistics_field(
    store: Store, drained: Any
) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    for minutes in (90, 50, 30, 10, 0):
        await store.record_request(
            row(
                f"r{minutes}", now - timedelta(minutes=minutes), error="boom", lane="background", channel="C9"
            )
        )
    await drained(store)
    found = await store.requests_between(now - timedelta(minutes=50), now)
    assert [r.request_id for r in found] == ["r50", "r30", "r10"]  # since included, until excluded
    first = found[0]
    assert (first.lane, first.channel, first.model, first.cached_tokens, first.ttft_ms) == (
        "background",
        "C9",
        "/models/m",
        60,
        120.0,
    )
    assert first.error is None  # left out: statistics never need the error text
    assert first.created_at == now - timedelta(minutes=50)
    assert [r.request_id for r in await store.requests_between(now - timedelta(hours=2))] == [
        "r90",
        "r50",
        "r30",
        "r10",
        "r0",
    ]


async def test_requests_still_in_the_write_buffer_are_included_once(store: Store, drained: Any) -> None:
    now = datetime.now(UTC)
    await store.record_request(row("stored", now - timedelta(seconds=5)))
    await drained(store)
    await store.record_request(row("fresh", now, status="timeout", ttft_ms=None))
    await store.record_request(row("stored", now - timedelta(seconds=5), status="undelivered"))
    # No wait: both may or may not have reached the database; each counts once, the newest wins.
    found = {r.request_id: r for r in await store.requests_between(now - timedelta(minutes=1))}
    assert set(found) == {"stored", "fresh"}
    assert found["fresh"].status == "timeout" and found["fresh"].ttft_ms is None
    assert found["stored"].status == "undelivered"
