"""Two real ``opsbot run`` replicas sharing one real PostgreSQL, both receiving every event.

Slack delivers every event twice (its retry) over two Socket Mode connections, one per replica;
Mattermost broadcasts every post to both replicas' websockets; Alertmanager's webhook goes to both.
Exactly one answer, one thread and one request row per event or alert group. A replica killed with
SIGKILL mid-answer leaves its lease to run out: the survivor notes the answer as interrupted in
its thread; a restarted replica does the same for its own previous run, and a resolve sent to it
lands as one short note in the group's thread.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import asyncpg
import pytest
from fakes.mattermost_server import FakeMattermost
from fakes.slack_server import FakeSlack
from sqlalchemy.engine import make_url

from bot.claims import INTERRUPTED_TEXT
from bot.config import StoreSettings
from bot.store import AlertThread, Store
from bot.store.records import Claim
from reliability.botproc import BotProcess, base_env
from reliability.helpers import alert_payload, poll

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(300)]

FOOTER_MARK = "request `"
LEASE_S = 3.0
"""The claim lease in these tests (the shipped default is 20 s): the note comes within ~1.25 leases."""
SCENARIOS = {
    "chat": {"max_tokens": 8},
    "alert_summary": {"max_tokens": 8},
    # "why ..." questions stream long enough for a replica to be killed mid-answer
    "root_cause": {"max_tokens": 1500, "ignore_eos": True},
}
QUESTIONS = 6
"""Questions per platform."""


async def rows(pg_url: str, sql: str) -> list[asyncpg.Record]:
    url = make_url(pg_url)
    conn = await asyncpg.connect(host=url.host, port=url.port, user=url.username, database=url.database)
    try:
        return list(await conn.fetch(sql))
    finally:
        await conn.close()


def env_for(tmp_path: Path, model: Path, pg_url: str, slack: FakeSlack, mm: FakeMattermost, channel: str):
    env = base_env(tmp_path, model, SCENARIOS)
    env.update(
        {
            "OPSBOT_STORE__URL": pg_url,
            "OPSBOT_STORE__CLAIM_LEASE_S": str(LEASE_S),
            "OPSBOT_ENGINE__DRAIN_TIMEOUT_S": "5",
            "OPSBOT_SLACK__ENABLED": "true",
            "OPSBOT_SLACK__BOT_TOKEN": slack.bot_token,
            "OPSBOT_SLACK__APP_TOKEN": slack.app_token,
            "OPSBOT_SLACK__API_BASE_URL": slack.api_url,
            "OPSBOT_SLACK__CHANNEL_POST_INTERVAL_S": "0",
            "OPSBOT_MATTERMOST__ENABLED": "true",
            "OPSBOT_MATTERMOST__URL": mm.host,
            "OPSBOT_MATTERMOST__SCHEME": "http",
            "OPSBOT_MATTERMOST__PORT": str(mm.port),
            "OPSBOT_MATTERMOST__TOKEN": mm.tokens_for(mm.bot_user_id),
            "OPSBOT_MATTERMOST__CHANNEL_POST_INTERVAL_S": "0",
            "OPSBOT_ALERTMANAGER__ENABLED": "true",
            "OPSBOT_ALERTMANAGER__TARGETS": f'["mattermost:{channel}"]',
        }
    )
    return env


@pytest.mark.slow
async def test_two_replicas_answer_each_event_once_and_note_a_killed_replicas_answer(
    tiny_model: Path, tmp_path: Path, pg_url: str
) -> None:
    async with FakeSlack() as slack, FakeMattermost() as mm:
        alice = mm.add_user("alice")
        channel = mm.add_channel("incidents", [alice, mm.bot_user_id])
        env = env_for(tmp_path, tiny_model, pg_url, slack, mm, channel)
        a, b = BotProcess("a", tmp_path, env), BotProcess("b", tmp_path, env)
        running = [a, b]
        try:
            await asyncio.gather(a.start(), b.start())
            await asyncio.gather(a.wait_ready(), b.wait_ready())
            await poll(lambda: mm.live_connections() >= 2 and slack.open_connections >= 2, what="4 sockets")

            # -- every event reaches both replicas ----------------------------------------------
            posts = [await mm.user_posts(alice, channel, f"@opsbot hello {i}") for i in range(QUESTIONS)]
            for i in range(QUESTIONS):
                event = slack.user_message("D1", "U1", f"hello {i}", channel_type="im")
                envelopes = await slack.deliver_event(event, copies=2)
                assert len({e.connection for e in envelopes}) == 2  # one copy to each replica
            firing = alert_payload("firing", ("f1", "f2"))
            assert await a.post("/alertmanager", firing) == 200
            assert await b.post("/alertmanager", firing) == 200

            def mm_finals(root: str) -> list[dict]:
                return [p for p in mm.bot_posts() if p["root_id"] == root and FOOTER_MARK in p["message"]]

            def headers() -> list[dict]:
                return [p for p in mm.bot_posts(channel) if not p["root_id"] and "FIRING" in p["message"]]

            def slack_finals() -> list:
                return [
                    m
                    for m in slack.bot_messages("D1")
                    if any(block.get("type") == "context" for block in (m.blocks or []))
                ]

            await poll(
                lambda: (
                    all(mm_finals(p["id"]) for p in posts)
                    and len(slack_finals()) >= QUESTIONS
                    and headers()
                    and mm_finals(headers()[0]["id"])
                ),
                timeout_s=120,
                what="every answer",
            )
            # Give a would-be duplicate a moment to show up.
            await asyncio.sleep(1.0)
            assert [len(mm_finals(p["id"])) for p in posts] == [1] * QUESTIONS
            assert all(len([q for q in mm.bot_posts() if q["root_id"] == p["id"]]) == 1 for p in posts)
            assert len(slack_finals()) == QUESTIONS
            assert len(headers()) == 1, "two replicas opened two threads for one alert group"
            header = headers()[0]
            assert len(mm_finals(header["id"])) == 1
            requests = await rows(pg_url, "SELECT platform, scenario, status FROM opsbot_requests")
            assert len(requests) == 2 * QUESTIONS + 1
            assert sorted({r["status"] for r in requests}) == ["ok"]
            # Both replicas got every event: the one that lost each claim dropped it as a duplicate.
            dropped = a.log().count("duplicate event") + b.log().count("duplicate event")
            print(f"{len(requests)} request rows; {dropped} duplicate deliveries dropped by claims")
            assert dropped >= 2 * QUESTIONS

            # -- SIGKILL mid-answer: the survivor notes it -----------------------------------------
            question = await mm.user_posts(alice, channel, "@opsbot why is checkout failing?")
            await poll(
                lambda: [p for p in mm.bot_posts() if p["root_id"] == question["id"]], what="placeholder"
            )
            leased = await rows(pg_url, "SELECT owner FROM opsbot_processed_events WHERE state = 'answering'")
            assert len(leased) == 1
            pid = int(leased[0]["owner"].split(":")[1])
            victim = next(p for p in running if p.proc is not None and p.proc.pid == pid)
            survivor = b if victim is a else a
            victim.kill()
            killed_at = time.monotonic()
            await victim.wait()
            running.remove(victim)

            def noted(root: str) -> list[dict]:
                return [
                    p for p in mm.bot_posts() if p["root_id"] == root and p["message"] == INTERRUPTED_TEXT
                ]

            await poll(lambda: noted(question["id"]), timeout_s=2 * LEASE_S + 10, what="the interrupted note")
            took = time.monotonic() - killed_at
            print(f"interrupted answer noted {took:.1f} s after SIGKILL (lease {LEASE_S} s)")
            await asyncio.sleep(LEASE_S / 2)  # one more sweep: no second note
            assert len(noted(question["id"])) == 1
            assert survivor.proc is not None and survivor.proc.returncode is None
            interrupted = await rows(
                pg_url, "SELECT status, scenario FROM opsbot_requests WHERE status = 'interrupted'"
            )
            assert [(r["status"], r["scenario"]) for r in interrupted] == [("interrupted", "root_cause")]

            # -- restart: the resolve lands in the same thread, once ------------------------------
            again = BotProcess("a2" if victim is a else "b2", tmp_path, env)
            running.append(again)
            await again.start()
            await again.wait_ready()
            resolved = alert_payload("resolved", ("f1", "f2"))
            assert await again.post("/alertmanager", resolved) == 200
            assert await survivor.post("/alertmanager", resolved) == 200

            def resolve_notes() -> list[dict]:
                return [p for p in mm.bot_posts() if "Resolved:" in p["message"]]

            await poll(resolve_notes, what="the resolve note")
            await asyncio.sleep(1.0)
            assert [(p["root_id"], len(resolve_notes())) for p in resolve_notes()] == [(header["id"], 1)]
            assert len(headers()) == 1

            # -- a lone replica killed mid-answer: its own restart notes it -----------------------
            await survivor.stop()
            running.remove(survivor)
            await poll(lambda: mm.live_connections() == 1, what="one websocket")
            lone = await mm.user_posts(alice, channel, "@opsbot why is the cart empty?")
            await poll(lambda: [p for p in mm.bot_posts() if p["root_id"] == lone["id"]], what="placeholder")
            again.kill()
            await again.wait()
            running.remove(again)
            third = BotProcess("c", tmp_path, env)
            running.append(third)
            await third.start()
            await third.wait_ready()
            await poll(lambda: noted(lone["id"]), timeout_s=2 * LEASE_S + 10, what="the note after restart")

            async def statuses() -> list[str]:
                return sorted(r["status"] for r in await rows(pg_url, "SELECT status FROM opsbot_requests"))

            async def both_rows() -> bool:  # the sweeper's row is buffered: it lands a moment later
                return (await statuses()).count("interrupted") == 2

            await poll(both_rows, timeout_s=10, what="the restarted replica's interrupted row")
            assert len(await statuses()) == 2 * QUESTIONS + 1 + 2
        finally:
            for proc in running:
                await proc.stop()


async def test_two_replicas_racing_for_a_dead_lease_or_an_alert_change_have_one_winner(pg_url: str) -> None:
    """The database rules the claim test above relies on, raced directly: one take-over of an expired
    lease, one opener of an alert group, one compare-and-set of its resolve."""
    settings = StoreSettings(claim_lease_s=0.2)
    dead = await Store.open(pg_url, settings)
    lease = Claim(
        "mattermost", "E1", request_id="r1", channel="C1", thread_id="T1", scenario="chat", lane="normal"
    )
    assert await dead.claim_event("mattermost", "E1", lease)
    await dead.close()  # it renews nothing from now on, as if killed
    a, b = (
        await Store.open(pg_url, settings, upgrade=False),
        await Store.open(pg_url, settings, upgrade=False),
    )
    try:
        assert await a.expired_claims() == []  # not yet: the lease still runs
        await asyncio.sleep(0.3)
        (found_a,), (found_b,) = await a.expired_claims(), await b.expired_claims()
        assert (found_a.request_id, found_a.thread_id, found_a.owner) == ("r1", "T1", dead.owner)
        wins = await asyncio.gather(a.take_over_claim(found_a), b.take_over_claim(found_b))
        assert sorted(wins) == [False, True]
        assert await a.expired_claims() == [] and await b.expired_claims() == []

        group = AlertThread("g", "mattermost", "C1", "", "opening", ["f1"])
        opened = await asyncio.gather(a.open_alert_thread(group), b.open_alert_thread(group))
        assert sorted(o is None for o in opened) == [False, True]  # one opener, one sees its row
        firing = AlertThread("g", "mattermost", "C1", "T9", "firing", ["f1"])
        assert await a.update_alert_thread(firing)
        seen_a, seen_b = await a.get_alert_thread("g"), await b.get_alert_thread("g")
        assert seen_a == seen_b == firing
        resolved = AlertThread("g", "mattermost", "C1", "T9", "resolved", [])
        cas = await asyncio.gather(
            a.update_alert_thread(resolved, expect=seen_a), b.update_alert_thread(resolved, expect=seen_b)
        )
        assert sorted(cas) == [False, True]  # one resolve note, not two
    finally:
        await a.close()
        await b.close()
