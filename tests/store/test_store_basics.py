"""Store behaviour on a SQLite file and on PostgreSQL: claims, threads, alerts, feedback, stats."""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, select

from bot.config import StoreSettings
from bot.store import AlertThread, RequestRecord, Store
from bot.store.models import FeedbackRow, ProcessedEventRow, RequestRow
from bot.store.records import Claim


def request(request_id: str, **fields: object) -> RequestRecord:
    values: dict[str, object] = {
        "platform": "slack",
        "channel": "C1",
        "thread_id": "1700000000.000100",
        "user": "U1",
        "scenario": "rca",
        "lane": "interactive",
        "status": "ok",
    }
    values.update(fields)
    return RequestRecord(request_id=request_id, **values)  # type: ignore[arg-type]


async def test_claim_event_is_won_only_by_the_first_claim(store: Store) -> None:
    assert await store.claim_event("slack", "Ev1") is True
    assert await store.claim_event("slack", "Ev1") is False
    assert await store.claim_event("mattermost", "Ev1") is True  # the key is per platform
    assert await store.claim_event("slack", "Ev2") is True


async def test_a_burst_of_claims_shares_statements_and_each_event_is_won_once(
    db_url: str, store_settings: StoreSettings, store: Store
) -> None:
    """64 mentions at once, one of them delivered three times (a platform retry racing the first
    copy), one already claimed by another replica, plus leased claims: one statement decides them
    together, and each event still has exactly one winner."""
    other = await Store.open(db_url, store_settings)  # another replica, same database
    try:
        assert await other.claim_event("slack", "Burst-7")
        ids = [f"Burst-{i}" for i in range(64)] + ["Burst-3", "Burst-3"]
        lease = Claim("slack", "Burst-5", request_id="r-5", channel="C1", thread_id="1.1", user="U1")
        inserts: list[str] = []

        def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
            if statement.lstrip().upper().startswith("INSERT INTO OPSBOT_PROCESSED_EVENTS"):
                inserts.append(statement)

        event.listen(store.write_engine, "before_cursor_execute", count)
        try:
            won = await asyncio.gather(
                *(store.claim_event("slack", e, lease if e == "Burst-5" else None) for e in ids)
            )
        finally:
            event.remove(store.write_engine, "before_cursor_execute", count)
    finally:
        await other.close()
    assert 1 <= len(inserts) <= 2, f"{len(ids)} claims took {len(inserts)} INSERT statements"
    by_event: dict[str, list[bool]] = {}
    for event_id, result in zip(ids, won, strict=True):
        by_event.setdefault(event_id, []).append(result)
    assert by_event.pop("Burst-7") == [False]  # the other replica has it
    assert by_event.pop("Burst-3") == [True, False, False]  # the first copy answers, once
    assert all(results == [True] for results in by_event.values())
    async with store.engine.connect() as conn:
        leased = (
            await conn.execute(
                select(ProcessedEventRow.state, ProcessedEventRow.request_id).where(
                    ProcessedEventRow.event_id == "Burst-5"
                )
            )
        ).one()
        plain = (
            await conn.execute(select(ProcessedEventRow.state).where(ProcessedEventRow.event_id == "Burst-9"))
        ).scalar_one()
    assert tuple(leased) == ("answering", "r-5")
    assert plain == "done"


async def _eventually(check: Any, *args: Any, timeout_s: float = 10.0) -> bool:
    """``await check(*args)`` until it is true (a write in the background landed) or time is up."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check(*args):
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def test_a_thread_is_the_bots_on_every_replica_from_the_moment_its_reply_is_posted(
    db_url: str, store_settings: StoreSettings, store: Store
) -> None:
    """Another bot worker (or replica) gets the follow-up before this one has written a single
    thread turn: the claim already says the reply is posted. Before that (the question is being
    asked, or was refused), messages in the thread are nobody's follow-ups."""
    other = await Store.open(db_url, store_settings)
    try:
        lease = Claim("slack", "Ev-top", request_id="r-top", channel="C1", thread_id="1700.1", user="U1")
        assert await store.claim_event("slack", "Ev-top", lease)
        assert await other.is_bot_thread("slack", "C1", "1700.1") is False  # claimed, nothing posted
        store.mark_replied("slack", "Ev-top", "C1", "1700.1", moved=False)
        assert await store.is_bot_thread("slack", "C1", "1700.1") is True  # in-process, at once
        assert await _eventually(other.is_bot_thread, "slack", "C1", "1700.1")  # from the claim row
        # A /rca starts its own thread: the claim is pointed at it when the reply is posted.
        rca = Claim("slack", "Ev-rca", request_id="r-rca", channel="C2", thread_id=None, user="U1")
        assert await store.claim_event("slack", "Ev-rca", rca)
        store.mark_replied("slack", "Ev-rca", "C2", "1800.5", moved=True)
        assert await _eventually(other.is_bot_thread, "slack", "C2", "1800.5")
        # A plain de-duplication key, or a question never replied to, makes no thread the bot's.
        assert await store.claim_event("slack", "Ev-plain")
        assert await other.is_bot_thread("slack", "C1", "Ev-plain") is False
    finally:
        await other.close()


async def test_a_post_from_before_the_question_is_no_follow_up_even_when_its_check_ends_late(
    db_url: str, store_settings: StoreSettings, store: Store
) -> None:
    """A burst in a thread: people talk, then someone @-mentions opsbot. The checks of the posts
    before the mention may end after its reply was marked (here: the database already says the
    thread is opsbot's); by the platform's clock they came before the question, so they stay
    people talking. Posts after it are follow-ups, and so is any post where a time is unknown."""
    question = Claim("slack", "Ev-q", request_id="r-q", channel="C1", thread_id="1700.1", user="U1")
    assert await store.claim_event("slack", "Ev-q", question)
    store.mark_replied("slack", "Ev-q", "C1", "1700.1", moved=False, since=1700.9)
    assert await store.is_bot_thread("slack", "C1", "1700.1", 1700.5) is False  # before it
    assert await store.is_bot_thread("slack", "C1", "1700.1", 1700.9) is False  # the question
    assert await store.is_bot_thread("slack", "C1", "1700.1", 1701.2) is True  # after it
    assert await store.is_bot_thread("slack", "C1", "1700.1") is True  # no time given
    # The same order holds when the answer comes from the database read: another worker's mark
    # is in the claim row, this process's own mark of the same thread lands while the read waits.
    other = await Store.open(db_url, store_settings)
    try:
        early = Claim("slack", "Ev-e", request_id="r-e", channel="C3", thread_id="1750.1", user="U1")
        assert await other.claim_event("slack", "Ev-e", early)
        other.mark_replied("slack", "Ev-e", "C3", "1750.1", moved=False, since=1750.2)
        assert await _eventually(store.is_bot_thread, "slack", "C3", "1750.1")  # from the row
        late_check = asyncio.ensure_future(store.is_bot_thread("slack", "C3", "1750.1", 1750.5))
        await asyncio.sleep(0)  # the check is now waiting for its read
        assert not late_check.done()
        store.mark_replied("slack", "Ev-l", "C3", "1750.1", moved=False, since=1750.8)
        assert await late_check is False
    finally:
        await other.close()
    # A /rca thread begins with opsbot's own post (no question time): every later post is a
    # follow-up, also once a mention in that thread is answered too.
    rca = Claim("slack", "Ev-rca", request_id="r-rca", channel="C2", thread_id=None, user="U1")
    assert await store.claim_event("slack", "Ev-rca", rca)
    store.mark_replied("slack", "Ev-rca", "C2", "1800.5", moved=True)
    store.mark_replied("slack", "Ev-m", "C2", "1800.5", moved=False, since=1900.0)
    assert await store.is_bot_thread("slack", "C2", "1800.5", 1850.0) is True


async def test_a_claim_is_still_refused_after_a_restart(
    db_url: str, store_settings: StoreSettings, store: Store
) -> None:
    assert await store.claim_event("slack", "Ev-restart")
    other = await Store.open(db_url, store_settings)
    try:
        assert await other.claim_event("slack", "Ev-restart") is False
    finally:
        await other.close()


async def test_thread_history_survives_closing_and_reopening_the_store(
    db_url: str, store_settings: StoreSettings, drained: Any
) -> None:
    first = await Store.open(db_url, store_settings)
    await first.append_message("slack", "C1", "T1", "user", "why is api-7f crashlooping?", user="U1")
    await first.append_message("slack", "C1", "T1", "assistant", "OOMKilled: limit 256Mi", request_id="r1")
    await first.append_message("slack", "C1", "T2", "user", "another thread", user="U2")
    # Buffered turns are visible at once, before they reach the database.
    assert [m.content for m in await first.thread_history("slack", "C1", "T1")] == [
        "why is api-7f crashlooping?",
        "OOMKilled: limit 256Mi",
    ]
    await first.close()

    second = await Store.open(db_url, store_settings)
    try:
        history = await second.thread_history("slack", "C1", "T1")
        assert [(m.role, m.content, m.user, m.request_id) for m in history] == [
            ("user", "why is api-7f crashlooping?", "U1", None),
            ("assistant", "OOMKilled: limit 256Mi", None, "r1"),
        ]
        assert all(m.created_at.tzinfo is not None for m in history)
        assert await second.is_bot_thread("slack", "C1", "T1") is True
        assert await second.is_bot_thread("slack", "C1", "T2") is False  # only a user turn
        assert await second.is_bot_thread("slack", "C1", "nope") is False
        await second.append_message("slack", "C1", "T1", "user", "and now?", user="U1")
        await drained(second)
        assert [m.content for m in await second.thread_history("slack", "C1", "T1", limit=2)] == [
            "OOMKilled: limit 256Mi",
            "and now?",
        ]
    finally:
        await second.close()


async def test_a_second_feedback_click_replaces_the_first(db_url: str, store: Store, drained: Any) -> None:
    await store.record_feedback("r1", "slack", "U1", 1)
    await store.record_feedback("r1", "slack", "U2", 1)
    await drained(store)
    await store.record_feedback("r1", "slack", "U1", -1)
    await store.record_feedback("r1", "mattermost", None, 1)
    await drained(store)
    async with store.engine.connect() as conn:
        rows = (await conn.execute(select(FeedbackRow.platform, FeedbackRow.user, FeedbackRow.value))).all()
    assert sorted(map(tuple, rows)) == [("mattermost", "", 1), ("slack", "U1", -1), ("slack", "U2", 1)]


async def test_alert_threads_are_saved_and_a_later_save_replaces_the_status(
    store: Store, drained: Any
) -> None:
    assert await store.get_alert_thread('{}:{alertname="X"}') is None
    thread = AlertThread('{}:{alertname="X"}', "slack", "C9", "1700000000.1", "firing")
    await store.save_alert_thread(thread)
    assert await store.get_alert_thread(thread.group_key) == thread  # visible while buffered
    await drained(store)
    assert await store.get_alert_thread(thread.group_key) == thread
    await store.save_alert_thread(AlertThread(thread.group_key, "slack", "C9", "1700000000.1", "resolved"))
    await drained(store)
    found = await store.get_alert_thread(thread.group_key)
    assert found is not None and found.status == "resolved"


async def test_recording_the_same_request_twice_keeps_one_row_with_the_latest_values(
    db_url: str, store: Store, drained: Any, count_rows: Any
) -> None:
    await store.record_request(request("dup", status="error", error="boom"))
    await drained(store)
    await store.record_request(request("dup", status="ok", ttft_ms=12.5, output_tokens=7))
    await store.record_request(request("dup", status="ok", ttft_ms=12.5, output_tokens=8))
    await drained(store)
    assert await count_rows(db_url, "opsbot_requests") == 1
    async with store.engine.connect() as conn:
        row = (await conn.execute(select(RequestRow).where(RequestRow.request_id == "dup"))).one()
    assert (row.status, row.error, row.ttft_ms, row.output_tokens) == ("ok", None, 12.5, 8)


async def test_every_request_field_is_stored(store: Store, drained: Any) -> None:
    created = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    record = RequestRecord(
        request_id="full",
        platform="mattermost",
        channel="town-square",
        thread_id="p1",
        user="alice",
        scenario="logs",
        lane="background",
        status="overloaded",
        error="queue full",
        model="tiny",
        prompt_tokens=100,
        cached_tokens=64,
        output_tokens=20,
        queue_ms=1.5,
        context_ms=2.5,
        ttft_ms=3.5,
        tpot_ms=4.5,
        e2e_ms=5.5,
        post_ms=6.5,
        created_at=created,
        finished_at=created + timedelta(seconds=1),
    )
    await store.record_request(record)
    await drained(store)
    async with store.engine.connect() as conn:
        row = (await conn.execute(select(RequestRow).where(RequestRow.request_id == "full"))).one()
    # every field is a column of the row, but an investigation's steps, which have their own table
    columns = [name for name in record.__dataclass_fields__ if name != "steps"]
    stored = {name: getattr(row, name) for name in columns}
    assert RequestRecord(**stored) == record


async def test_latency_stats_give_count_errors_and_percentiles_per_scenario_and_platform(
    store: Store, drained: Any
) -> None:
    now = datetime.now(UTC)
    for i in range(1, 11):  # ttft 10..100, tpot 1..10, queue 0..9, e2e 100..1000
        await store.record_request(
            request(
                f"rca-{i}",
                ttft_ms=10.0 * i,
                tpot_ms=float(i),
                queue_ms=float(i - 1),
                e2e_ms=100.0 * i,
                created_at=now - timedelta(minutes=i),
            )
        )
    await store.record_request(request("rca-err", status="error", created_at=now - timedelta(minutes=1)))
    await store.record_request(request("rca-mm", platform="mattermost", ttft_ms=42.0, created_at=now))
    await store.record_request(request("old", ttft_ms=1.0, created_at=now - timedelta(days=2)))
    await drained(store)

    stats = await store.latency_stats(now - timedelta(hours=1), now + timedelta(seconds=1))
    assert [(s.scenario, s.platform, s.count, s.errors) for s in stats] == [
        ("rca", "mattermost", 1, 0),
        ("rca", "slack", 11, 1),
    ]
    slack = stats[1]
    assert slack.by_status == {"error": 1, "ok": 10}
    # Linear interpolation over the 10 values (the error row has none): p50 = 55, p90 = 91, p99 = 99.1.
    assert slack.ttft_ms.p50 == pytest.approx(55.0)
    assert slack.ttft_ms.p90 == pytest.approx(91.0)
    assert slack.ttft_ms.p99 == pytest.approx(99.1)
    assert slack.tpot_ms.p50 == pytest.approx(5.5)
    assert slack.queue_ms.p90 == pytest.approx(8.1)
    assert slack.e2e_ms.p99 == pytest.approx(991.0)
    assert stats[0].ttft_ms.p50 == stats[0].ttft_ms.p99 == pytest.approx(42.0)
    assert stats[0].tpot_ms.p50 is None

    # ``until`` is exclusive and the window excludes older rows.
    later = await store.latency_stats(now - timedelta(minutes=2, seconds=30), now - timedelta(seconds=1))
    assert [(s.platform, s.count) for s in later] == [("slack", 3)]

    ttft = await store.recent_ttft(now - timedelta(hours=1))
    assert sorted(ttft) == [10.0 * i for i in range(1, 5)] + [42.0] + [10.0 * i for i in range(5, 11)]


async def test_latency_stats_include_requests_still_in_the_buffer(store: Store) -> None:
    now = datetime.now(UTC)
    await store.record_request(request("fresh", ttft_ms=7.0, created_at=now))
    # No wait: the row may not have reached the database yet, and still counts.
    stats = await store.latency_stats(now - timedelta(minutes=1))
    assert [(s.count, s.ttft_ms.p50) for s in stats] == [(1, 7.0)]
    assert await store.recent_ttft(now - timedelta(minutes=1)) == [7.0]
    naive_since = (now - timedelta(minutes=1)).replace(tzinfo=None)  # naive datetimes are read as UTC
    assert [s.count for s in await store.latency_stats(naive_since)] == [1]


async def test_old_processed_events_are_pruned(store: Store) -> None:
    assert await store.claim_event("slack", "old-event")
    assert await store.prune_events(timedelta(days=7)) == 0
    assert await store.prune_events(timedelta(seconds=-1)) == 1
    assert await store.claim_event("slack", "old-event") is True  # forgotten after pruning


async def test_a_batch_written_again_after_a_lost_acknowledgement_adds_no_duplicates(
    db_url: str, store: Store, count_rows: Any
) -> None:
    from bot.store.buffer import PendingClaim, PendingFeedback, PendingMessage

    batch = [
        request("acked-late"),
        PendingMessage("slack", "C1", "T-acked", "user", "hello", "U1", None),
        PendingFeedback("acked-late", "slack", "U1", 1),
        PendingClaim("slack", "Ev-acked"),
        AlertThread("group-acked", "slack", "C1", "T-acked", "firing"),
    ]
    # What the writer does when a commit succeeded but the connection died before it heard so.
    await store._write_batch(batch)
    await store._write_batch(batch)
    for table in (
        "opsbot_requests",
        "opsbot_thread_messages",
        "opsbot_threads",
        "opsbot_feedback",
        "opsbot_processed_events",
        "opsbot_alert_threads",
    ):
        assert await count_rows(db_url, table) == 1, table


async def test_sqlite_connections_use_wal_busy_timeout_and_foreign_keys(
    sqlite_url: str, store_settings: StoreSettings
) -> None:
    from sqlalchemy import text

    store = await Store.open(sqlite_url, store_settings)
    try:
        async with store.engine.connect() as conn:
            assert (await conn.scalar(text("PRAGMA journal_mode"))) == "wal"
            assert (await conn.scalar(text("PRAGMA busy_timeout"))) == store_settings.busy_timeout_ms
            assert (await conn.scalar(text("PRAGMA foreign_keys"))) == 1
        # The writer's own connection (the write transactions' file handle) is tuned the same way.
        with store.write_engine.connect() as sync_conn:
            assert sync_conn.scalar(text("PRAGMA journal_mode")) == "wal"
            assert sync_conn.scalar(text("PRAGMA busy_timeout")) == store_settings.busy_timeout_ms
            assert sync_conn.scalar(text("PRAGMA foreign_keys")) == 1
    finally:
        await store.close()


async def test_a_sqlite_write_transaction_commits_while_the_event_loop_is_busy(
    sqlite_url: str, store_settings: StoreSettings
) -> None:
    """SQLite has one write lock per file. A store's write transaction must not need the event loop
    between its BEGIN and its COMMIT: with several bot processes on one file (``workers = N``) the
    lock would be held through the loop's busy turns while the other processes wait it out. Here the
    loop is blocked right after a burst of claims is handed over; the claims are committed (seen
    from another connection) before the loop runs again."""
    import sqlite3

    store = await Store.open(sqlite_url, store_settings)
    try:
        claims = [asyncio.ensure_future(store.claim_event("slack", f"Busy-{i}")) for i in range(64)]
        for _ in range(20):  # the claims' batch is handed to the database
            await asyncio.sleep(0)
        time.sleep(1.0)  # CPU work on the loop (another answer's prompt, a Bolt dispatch)
        path = sqlite_url.split(":///", 1)[1]
        with contextlib.closing(sqlite3.connect(path, timeout=0)) as reader:
            committed = reader.execute(
                "SELECT count(*) FROM opsbot_processed_events WHERE event_id LIKE 'Busy-%'"
            ).fetchone()[0]
        assert committed == 64, f"{committed} of 64 claims committed while the loop was blocked"
        assert all(await asyncio.gather(*claims))
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("url", "own_writer"),
    [
        ("sqlite+aiosqlite:///{tmp}/a.db", True),
        ("sqlite+aiosqlite://", False),
        ("sqlite+aiosqlite:///:memory:", False),
    ],
)
def test_only_a_sqlite_file_gets_a_writer_thread(url: str, own_writer: bool, tmp_path: Any) -> None:
    """An in-memory database seen through a second connection would be another, empty database."""
    from bot.store.db import create_engine, sqlite_writer

    engine = create_engine(url.format(tmp=tmp_path), StoreSettings())
    writer = sqlite_writer(engine, StoreSettings())
    assert (writer is not None) is own_writer
    if writer is not None:
        writer.engine.dispose()
