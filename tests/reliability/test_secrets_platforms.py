"""Secrets pasted into chat never reach a stored row, a log line (at DEBUG, SQLAlchemy echoing
too) or a reply, whichever way they come in: a Slack mention (signed HTTP event), a Slack slash
command, a Mattermost mention (websocket), a Mattermost /rca, an Alertmanager notification.

Every write path of bot/store is exercised by these: the processed-event claim, the request row,
the thread and its turns, the alert thread, feedback. The database file is dumped whole afterwards.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sqlite3
import time
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.logs import setup_logging
from reliability.sec_world import ALERT_TOKEN, SLASH_TOKEN, World, world

pytestmark = pytest.mark.timeout(240)

CORPUS = Path(__file__).resolve().parents[1] / "redaction" / "corpus" / "secrets.jsonl"
ROWS = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]


def pasted(offset: int) -> tuple[str, list[str]]:
    """One entry of every kind (a different one per call): the text and its secrets."""
    by_kind: dict[str, list[dict]] = {}
    for row in ROWS:
        by_kind.setdefault(row["kind"], []).append(row)
    chosen = [rows[offset % len(rows)] for rows in by_kind.values()]
    return "\n".join(r["text"] for r in chosen), [s for r in chosen for s in r["secrets"]]


@pytest.fixture
async def w(tiny_model: Path, tmp_path: Path) -> AsyncIterator[World]:
    stream = io.StringIO()
    setup_logging("DEBUG", stream=stream)  # the production handler: redacting filter on it
    for noisy in ("slack_sdk", "aiosqlite"):
        logging.getLogger(noisy).setLevel(logging.DEBUG)
    try:
        async with world(tiny_model, tmp_path, max_tokens=3) as running:
            logging.getLogger().setLevel(logging.DEBUG)
            running.store.engine.echo = "debug"
            running.store.write_engine.echo = "debug"  # a SQLite file's writes: the writer thread
            running.extra["log"] = stream
            yield running
    finally:
        logging.getLogger().handlers.clear()
        for name in ("slack_sdk", "aiosqlite", "sqlalchemy.engine.Engine"):
            logging.getLogger(name).setLevel(logging.NOTSET)


async def settle(w: World, expected_rows: int, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with sqlite3.connect(w.db) as conn:
            rows = conn.execute("SELECT count(*) FROM opsbot_requests").fetchone()[0]
        if rows >= expected_rows and not w.pipeline.in_flight and not w.store.buffered:
            return
        assert time.monotonic() < deadline, f"{rows} request rows, {w.pipeline.in_flight} in flight"
        await asyncio.sleep(0.1)


async def test_secrets_from_every_entry_point_reach_no_row_log_line_or_reply(w: World) -> None:
    secrets: list[str] = []
    raw_records: list[str] = []

    class Raw(logging.Handler):  # what a handler without opsbot's filter would see from SQL logging
        def emit(self, record: logging.LogRecord) -> None:
            raw_records.append(record.getMessage())

    raw = Raw(logging.DEBUG)
    for name in ("sqlalchemy.engine.Engine", "aiosqlite"):
        logging.getLogger(name).addHandler(raw)
    try:
        # Slack mention over the signed Events API.
        text, planted = pasted(0)
        secrets += planted
        event = w.slack.user_message("C1", "U1", f"<@{w.slack.bot_user_id}> is this ok?\n{text}")
        event["type"] = "app_mention"
        assert (await w.slack.post_to_app(w.slack_url, "event", w.slack.event_callback(event))).status == 200
        # Slack /rca slash command.
        text, planted = pasted(1)
        secrets += planted
        command = w.slack.slash_command("C1", "U1", f"why does this fail: {text}")
        assert (await w.slack.post_to_app(w.slack_url, "command", command)).status == 200
        # Mattermost mention over the websocket.
        alice = w.mm.add_user("alice")
        channel = w.mm.add_channel("incidents", [alice, w.mm.bot_user_id])
        text, planted = pasted(2)
        secrets += planted
        await w.mm.user_posts(alice, channel, f"@opsbot check this config\n{text}")
        # Mattermost /rca.
        text, planted = pasted(3)
        secrets += planted
        form = {
            "token": SLASH_TOKEN,
            "channel_id": channel,
            "user_id": alice,
            "text": text,
            "trigger_id": "t1",
        }
        async with w.session.post(
            w.base_url + "/mattermost/command",
            data=urllib.parse.urlencode(form),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        ) as resp:
            assert resp.status == 200
        # Alertmanager: secrets in labels and annotations.
        text, planted = pasted(4)
        secrets += planted
        payload = {
            "version": "4",
            "groupKey": '{}:{alertname="ConfigLeak"}',
            "status": "firing",
            "receiver": "opsbot",
            "groupLabels": {"alertname": "ConfigLeak"},
            "commonLabels": {"alertname": "ConfigLeak"},
            "commonAnnotations": {"description": text},
            "alerts": [
                {
                    "status": "firing",
                    "labels": {"alertname": "ConfigLeak", "dsn": ROWS[0]["text"]},
                    "annotations": {"summary": line},
                    "fingerprint": f"{index:016x}",
                }
                for index, line in enumerate(text.split("\n")[:10])
            ],
        }
        secrets += ROWS[0]["secrets"]
        async with w.session.post(
            w.base_url + "/alertmanager", json=payload, headers={"Authorization": f"Bearer {ALERT_TOKEN}"}
        ) as resp:
            assert resp.status == 200
        await settle(w, expected_rows=5)
        await w.store.close()  # flush everything to the file
    finally:
        for name in ("sqlalchemy.engine.Engine", "aiosqlite"):
            logging.getLogger(name).removeHandler(raw)

    with sqlite3.connect(w.db) as conn:
        stored = "\n".join(conn.iterdump())
        turns = conn.execute("SELECT count(*) FROM opsbot_thread_messages").fetchone()[0]
        alert_threads = conn.execute("SELECT count(*) FROM opsbot_alert_threads").fetchone()[0]
    replies = "\n".join(
        [m.text or "" for m in w.slack.bot_messages()]
        + [json.dumps(m.blocks or []) for m in w.slack.bot_messages()]
        + [p["message"] for p in w.mm.bot_posts()]
    )
    places = {
        "database": stored,
        "log (DEBUG, SQL echo)": w.extra["log"].getvalue(),
        "unfiltered SQL/driver records": "\n".join(raw_records),
        "replies": replies,
    }
    assert turns >= 8 and alert_threads == 1  # every path wrote: so the check is not vacuous
    assert "INSERT INTO opsbot_thread_messages" in places["unfiltered SQL/driver records"]
    assert len(secrets) >= 150
    leaks = [(where, s[:16]) for s in secrets for where, text in places.items() if s in text]
    assert not leaks, f"{len(leaks)} leaks of {len(secrets)} secrets: {leaks[:8]}"
