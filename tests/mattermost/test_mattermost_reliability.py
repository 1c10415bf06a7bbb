"""Never twice, never lost: websocket drops and a half-open socket, 429 / 500 on post creation,
replies that cannot be delivered; and the real mattermostdriver against the fake (fidelity)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from fakes.mattermost_server import FakeMattermost
from fixtures_pg import pg_url  # noqa: F401  (fixture)
from mattermostdriver import Driver
from mattermostdriver.websocket import Websocket
from mm_helpers import BotFactory, request_rows
from prometheus_client import REGISTRY

from bot.config import StoreSettings
from bot.store import Store

FOOTER_MARK = "request `"


def bot_replies(fake: FakeMattermost, root_id: str) -> list[dict[str, Any]]:
    return [p for p in fake.bot_posts() if p["root_id"] == root_id]


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_websocket_drops_every_20_posts_and_a_half_open_spell_lose_no_mention_and_answer_none_twice(
    fake: FakeMattermost, start_bot: BotFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="bot.adapters.mattermost")
    alice = fake.add_user("alice")
    channel = fake.add_channel("incidents", [alice, fake.bot_user_id])
    bot = await start_bot(max_tokens=1, edit_interval_s=0.02, websocket_silence_s=1.0)
    fake.drop_every = 20
    mentions: list[str] = []
    for batch in range(20):
        if batch == 10:
            await fake.wait_for(lambda: fake.live_connections() == 1)
            # Half-open: the socket stays up but nothing flows either way, pings included, for
            # longer than the silence timeout (the adapter must notice and reconnect by itself).
            fake.go_silent()
        for i in range(10):
            post = await fake.user_posts(alice, channel, f"@opsbot question {batch * 10 + i}")
            mentions.append(post["id"])
        done = list(mentions)
        await fake.wait_for(lambda done=done: all(bot_replies(fake, m) for m in done), timeout=60)

    def all_final() -> bool:
        return all(any(FOOTER_MARK in p["message"] for p in bot_replies(fake, m)) for m in mentions)

    await fake.wait_for(all_final, timeout=60)
    assert len(mentions) == 200
    duplicates = {m: len(bot_replies(fake, m)) for m in mentions if len(bot_replies(fake, m)) != 1}
    assert not duplicates, duplicates
    assert fake.ws_drops >= 5
    assert bot.adapter.ws_connects >= fake.ws_drops  # it came back after every drop and the silence
    assert any("silent for" in r.getMessage() for r in caplog.records), "half-open socket not noticed"
    assert bot.adapter.caught_up_posts > 0  # some mentions only ever arrived through the REST catch-up
    assert await request_rows(bot.adapter.store, 200) == 200  # one request row per mention
    # Every post seen before a drop was followed by a REST catch-up of the gap.
    assert len(fake.calls_to("GET", rf"/api/v4/channels/{channel}/posts")) >= fake.ws_drops


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_429_and_500_on_post_creation_over_100_answers_deliver_every_answer_exactly_once(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    alice = fake.add_user("alice")
    channel = fake.add_channel("incidents", [alice, fake.bot_user_id])
    failed_before = metric("opsbot_replies_failed_total", platform="mattermost")
    bot = await start_bot(
        max_tokens=1, edit_interval_s=0.02, retry={"initial_s": 0.05, "max_s": 0.3, "max_retries": 15}
    )
    # Of all creates: 30 % rate-limited, 10 % failing before the post is made and 10 % failing
    # after it was made (the client cannot tell; pending_post_id keeps the retry idempotent).
    fake.add_fault("POST", "/api/v4/posts", 429, probability=0.3, retry_after=0.25, seed=1)
    fake.add_fault("POST", "/api/v4/posts", 500, probability=1 / 7, seed=2)
    fake.add_fault("POST", "/api/v4/posts", 500, probability=1 / 6, after=True, seed=3)
    mentions = [(await fake.user_posts(alice, channel, f"@opsbot q{i}"))["id"] for i in range(100)]

    def all_final() -> bool:
        return all(any(FOOTER_MARK in p["message"] for p in bot_replies(fake, m)) for m in mentions)

    await fake.wait_for(all_final, timeout=240)
    assert all(len(bot_replies(fake, m)) == 1 for m in mentions)
    assert await request_rows(bot.adapter.store, 100) == 100
    creates = fake.calls_to("POST", "/api/v4/posts")
    statuses = [c.status for c in creates]
    assert statuses.count(429) >= 15 and statuses.count(500) >= 10
    # No retry came before the Retry-After the server asked for (measured on the fake's clock).
    by_pending: dict[str, list[Any]] = {}
    for call in creates:
        by_pending.setdefault(call.body["pending_post_id"], []).append(call)
    for calls in by_pending.values():
        for prev, nxt in zip(calls, calls[1:], strict=False):
            if prev.status == 429:
                assert nxt.started - prev.finished >= 0.25 * 0.95
    assert metric("opsbot_replies_failed_total", platform="mattermost") == failed_before
    assert (
        metric("opsbot_chat_api_retries_total", platform="mattermost", method="POST /posts", reason="429") > 0
    )


async def test_a_reply_that_cannot_be_delivered_after_retries_is_counted_and_logged_with_ids(
    fake: FakeMattermost, start_bot: BotFactory, caplog: pytest.LogCaptureFixture
) -> None:
    alice = fake.add_user("alice")
    channel = fake.add_channel("incidents", [alice, fake.bot_user_id])
    # The final edit retries until its deadline (an answer's final text is worth the wait).
    await start_bot(
        max_tokens=1, retry={"initial_s": 0.05, "max_s": 0.3, "max_retries": 2, "deadline_s": 1.5}
    )
    fake.add_fault("PUT", r"/api/v4/posts/\w+/patch", 503)
    before = metric("opsbot_replies_failed_total", platform="mattermost")
    caplog.set_level(logging.INFO)
    post = await fake.user_posts(alice, channel, "@opsbot will this arrive?")
    await fake.wait_for(lambda: len(fake.calls_to("PUT", r"/api/v4/posts/\w+/patch")) >= 3)
    deadline = asyncio.get_running_loop().time() + 10
    while metric("opsbot_replies_failed_total", platform="mattermost") == before:
        assert asyncio.get_running_loop().time() < deadline, "failure was not counted"
        await asyncio.sleep(0.05)
    failing = fake.calls_to("PUT", r"/api/v4/posts/\w+/patch")[-1]
    line = next(r.getMessage() for r in caplog.records if "could not be posted" in r.getMessage())
    assert failing.request_id in line  # the server's request id, for its own logs
    await fake.wait_for(lambda: len(bot_replies(fake, post["id"])) == 2)
    placeholder, note = bot_replies(fake, post["id"])  # never a second answer: a note says why
    assert "could not post its whole answer" in note["message"] and "503" in note["message"]


async def test_the_real_mattermostdriver_speaks_to_the_fake_rest_and_websocket(fake: FakeMattermost) -> None:
    """Fidelity of the fake: mattermostdriver (pointed at it by configuration) logs in, posts,
    authenticates its websocket, and gets ``posted`` events with the JSON-in-JSON post."""
    alice = fake.add_user("alice")
    channel = fake.add_channel("town-square", [alice, fake.bot_user_id])
    options = {
        "url": fake.host,
        "port": fake.port,
        "scheme": "http",
        "token": fake.tokens_for(fake.bot_user_id),
        "keepalive": False,
    }
    driver = Driver(options)
    me = await asyncio.to_thread(driver.login)
    assert me["id"] == fake.bot_user_id
    created = await asyncio.to_thread(driver.posts.create_post, {"channel_id": channel, "message": "hi"})
    assert fake.posts[created["id"]]["message"] == "hi"

    events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def handler(raw: str) -> None:
        await events.put(json.loads(raw))

    ws = Websocket(driver.options, driver.client.token)
    task = asyncio.create_task(ws.connect(handler))
    try:
        first = await asyncio.wait_for(events.get(), 10)
        assert first["event"] == "hello" and first["seq"] == 0
        await fake.user_posts(alice, channel, "hello @opsbot")
        while True:
            event = await asyncio.wait_for(events.get(), 10)
            if event.get("event") == "posted":
                break
        post = json.loads(event["data"]["post"])
        assert post["message"] == "hello @opsbot" and event["seq"] > 0
        assert json.loads(event["data"]["mentions"]) == [fake.bot_user_id]
    finally:
        ws.disconnect()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def shared_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'shared.db'}"
    return str(request.getfixturevalue("pg_url"))


async def test_two_replicas_sharing_one_database_answer_every_mention_once(
    fake: FakeMattermost, start_bot: BotFactory, shared_db_url: str
) -> None:
    alice = fake.add_user("alice")
    channel = fake.add_channel("incidents", [alice, fake.bot_user_id])
    settings = StoreSettings(retry={"initial_s": 0.02, "max_s": 0.2}, busy_timeout_ms=5000)
    stores = [await Store.open(shared_db_url, settings) for _ in range(2)]
    try:
        bots = [await start_bot(max_tokens=1, edit_interval_s=0.02, bot_store=s) for s in stores]
        mentions = [(await fake.user_posts(alice, channel, f"@opsbot q{i}"))["id"] for i in range(20)]
        await fake.wait_for(
            lambda: all(any(FOOTER_MARK in p["message"] for p in bot_replies(fake, m)) for m in mentions)
        )
        assert all(len(bot_replies(fake, m)) == 1 for m in mentions)
        assert await request_rows(stores[0], 20) == 20
        for bot in bots:
            await bot.stop()
    finally:
        for s in stores:
            await s.close(flush_timeout_s=5)


async def test_a_mention_made_while_disconnected_is_caught_up_even_after_leaving_another_channel(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    alice = fake.add_user("alice")
    left = fake.add_channel("old-incident", [alice, fake.bot_user_id])
    channel = fake.add_channel("incidents", [alice, fake.bot_user_id])
    bot = await start_bot(max_tokens=1)
    await fake.wait_for(lambda: fake.live_connections() == 1)
    fake.members[left].discard(fake.bot_user_id)  # opsbot was removed from one channel
    await fake.drop_websockets()
    post = await fake.user_posts(alice, channel, "@opsbot missed me?")  # nobody is connected now
    await fake.wait_for(lambda: any(FOOTER_MARK in p["message"] for p in bot_replies(fake, post["id"])))
    assert bot.adapter.caught_up_posts == 1
    assert len(bot_replies(fake, post["id"])) == 1
