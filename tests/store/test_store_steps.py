"""Investigation steps: stored with their request row (their own table, migration 0006), read back by
``Store.steps_between`` whether still buffered or written, on a SQLite file and on PostgreSQL, and
summarised by ``opsbot stats``."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from bot.stats import build_report, render_json, render_text
from bot.store import RequestRecord, StepRecord, Store


def investigation(request_id: str, created_at: datetime) -> RequestRecord:
    steps = [
        StepRecord(1, "call", "ok", "kube_logs", '{"pod": "api-1"}', 1000, 300, 30, 250.0, 600.0, 12.0, 180),
        StepRecord(
            2, "call", "error", "kube_events", '{"namespace": "data"}', 1250, 1020, 28, 40.0, 500.0, 1.0, 20
        ),
        StepRecord(3, "answer", "ok", None, None, 1320, 1290, 120, 35.0, 2400.0),
        StepRecord(4, "root_cause", "ok", None, None, 1460, 1440, 90, 30.0, 1800.0),
    ]
    return RequestRecord(
        request_id=request_id,
        platform="slack",
        channel="C1",
        thread_id="1.2",
        user="U1",
        scenario="root_cause",
        lane="normal",
        status="ok",
        prompt_tokens=1320,
        cached_tokens=1290,
        created_at=created_at,
        root_cause=json.dumps({"root_cause": [{"kind": "Pod", "namespace": "shop", "name": "api-1"}]}),
        steps=steps,
    )


async def test_steps_are_read_back_buffered_and_stored_and_a_retried_row_does_not_double_them(
    store: Store, drained: Any, count_rows: Any, db_url: str
) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    record = investigation("req-inv", now - timedelta(minutes=1))
    await store.record_request(record)
    buffered = await store.steps_between(now - timedelta(hours=1))
    assert [(s.request_id, s.index, s.tool) for s in buffered][:2] == [
        ("req-inv", 1, "kube_logs"),
        ("req-inv", 2, "kube_events"),
    ]
    await drained(store)
    await store.record_request(record)  # a batch written twice (a late acknowledgement) upserts
    await drained(store)
    assert await count_rows(db_url, "opsbot_investigation_steps") == 4
    stored = await store.steps_between(now - timedelta(hours=1))
    assert [s.index for s in stored] == [1, 2, 3, 4]
    assert stored[1].status == "error" and stored[1].arguments == '{"namespace": "data"}'
    assert stored[0].ttft_ms == 250.0 and stored[0].tool_tokens == 180
    (row,) = await store.requests_between(now - timedelta(hours=1))
    assert row.root_cause is not None and json.loads(row.root_cause)["root_cause"][0]["name"] == "api-1"
    assert await store.steps_between(now - timedelta(hours=1), now - timedelta(minutes=30)) == []


def test_stats_show_step_ttft_cache_reuse_per_step_and_calls_per_tool() -> None:
    now = datetime.now(UTC)
    record = investigation("req-inv", now)
    steps = [replace(step, request_id="req-inv") for step in record.steps]
    report = build_report([record], now - timedelta(hours=1), now, ["scenario"], steps)
    text = render_text(report)
    assert "investigations: 1, 4 model steps, 0 unparsed calls" in text
    # Each step's cached tokens cover the previous prompt and the call written after it: above 100 %.
    assert "mean 104.8 %, min 102.0 %" in text
    kube_logs = next(line for line in text.splitlines() if line.startswith("kube_logs"))
    assert kube_logs.split()[1:4] == ["1", "0", "12.0"]
    assert render_json(report)["investigations"]["tools"][0]["failed"] == 1  # type: ignore[index]
