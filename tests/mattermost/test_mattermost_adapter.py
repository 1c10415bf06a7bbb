"""opsbot's Mattermost adapter against the fake Mattermost server, with the real pipeline and the
CPU engine on the tiny model: mentions, DMs, /rca, follow-ups, streaming, splitting, buttons."""

from __future__ import annotations

import asyncio
from typing import Any

import sqlalchemy as sa
from fakes.mattermost_server import FakeMattermost
from mm_helpers import ACTION_SECRET, SLASH_TOKEN, BotFactory

from bot.store import Store
from bot.types import FinalAnswer, IncomingMessage, MessageKind

FOOTER_MARK = "request `"


def answers_in(fake: FakeMattermost, root_id: str) -> list[dict[str, Any]]:
    """Finished bot answers (footer rendered) in the thread of ``root_id``."""
    return [p for p in fake.bot_posts() if p["root_id"] == root_id and FOOTER_MARK in p["message"]]


def bot_replies(fake: FakeMattermost, root_id: str) -> list[dict[str, Any]]:
    return [p for p in fake.bot_posts() if p["root_id"] == root_id]


def world(fake: FakeMattermost) -> tuple[str, str]:
    alice = fake.add_user("alice")
    channel = fake.add_channel("incidents", [alice, fake.bot_user_id])
    return alice, channel


async def test_a_mention_in_a_channel_is_answered_in_a_thread_started_at_the_mention(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    alice, channel = world(fake)
    bot = await start_bot()
    post = await fake.user_posts(alice, channel, "@opsbot why is checkout failing?")
    await fake.wait_for(lambda: len(answers_in(fake, post["id"])) == 1)
    answer = answers_in(fake, post["id"])[0]
    assert answer["channel_id"] == channel
    assert "s ·" in answer["message"] or " s" in answer["message"]  # timings carry units
    actions = answer["props"]["attachments"][0]["actions"]
    assert [a["name"] for a in actions] == ["👍", "👎"]
    assert actions[0]["integration"]["url"] == bot.url + "/mattermost/actions"
    # A mention inside the thread continues the same thread.
    reply = await fake.user_posts(alice, channel, "@opsbot and now?", root_id=post["id"])
    await fake.wait_for(lambda: len(answers_in(fake, post["id"])) == 2)
    assert all(p["root_id"] == post["id"] for p in fake.bot_posts())
    assert reply["id"] != post["id"]


async def test_a_direct_message_is_answered_in_its_thread(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    bob = fake.add_user("bob")
    dm = fake.add_dm(bob)
    await start_bot()
    post = await fake.user_posts(bob, dm, "is the api healthy?")
    await fake.wait_for(lambda: len(answers_in(fake, post["id"])) == 1)
    assert answers_in(fake, post["id"])[0]["channel_id"] == dm


async def test_posts_by_bots_system_messages_edits_and_unmentioned_posts_are_not_answered(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    alice, channel = world(fake)
    other_bot = fake.add_user("alertbot", is_bot=True)
    fake.members[channel].add(other_bot)
    await start_bot()
    ignored = [
        await fake.user_posts(other_bot, channel, "@opsbot from another bot"),
        await fake.user_posts(alice, channel, "@opsbot joined", type="system_join_channel"),
        await fake.user_posts(alice, channel, "just chatting, no mention"),
    ]
    edited = await fake.user_posts(alice, channel, "typo here")
    await fake.user_edits(edited["id"], "@opsbot fixed the typo")
    # A real mention afterwards proves the earlier ones were looked at and passed over.
    probe = await fake.user_posts(alice, channel, "@opsbot ping")
    await fake.wait_for(lambda: len(answers_in(fake, probe["id"])) == 1)
    for post in [*ignored, edited]:
        assert not [p for p in fake.bot_posts() if p["root_id"] == post["id"]]


async def test_rca_help_and_status_come_back_in_the_ephemeral_command_response(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    alice, channel = world(fake)
    bot = await start_bot()
    status, body, _ = await fake.send_slash_command(
        bot.command_url, token=SLASH_TOKEN, user_id=alice, channel_id=channel, text="help"
    )
    assert status == 200 and body["response_type"] == "ephemeral"
    assert "/rca" in body["text"]
    status, body, _ = await fake.send_slash_command(
        bot.command_url, token=SLASH_TOKEN, user_id=alice, channel_id=channel, text="status"
    )
    assert status == 200 and body["response_type"] == "ephemeral"
    assert "status" in body["text"].lower() and "TTFT" in body["text"]
    assert not fake.bot_posts()  # nothing visible to the channel


async def test_rca_is_acknowledged_at_once_and_answered_in_a_thread_under_a_quote_of_the_request(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    alice, channel = world(fake)
    bot = await start_bot()
    status, body, _ = await fake.send_slash_command(
        bot.command_url, token=SLASH_TOKEN, user_id=alice, channel_id=channel, text="payments pods crashloop"
    )
    assert status == 200 and body["response_type"] == "ephemeral"
    roots = lambda: [p for p in fake.bot_posts(channel) if not p["root_id"]]  # noqa: E731
    await fake.wait_for(lambda: len(roots()) == 1 and len(answers_in(fake, roots()[0]["id"])) == 1)
    quote = roots()[0]["message"]
    assert "@alice" in quote and "/rca payments pods crashloop" in quote
    rows = await _rows(bot.adapter.store, "SELECT scenario, lane FROM opsbot_requests", 1)
    assert rows == [("root_cause", "urgent")]


async def test_a_slash_command_with_a_bad_token_is_refused_with_401(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    alice, channel = world(fake)
    bot = await start_bot()
    status, _, _ = await fake.send_slash_command(
        bot.command_url, token="not-the-token", user_id=alice, channel_id=channel, text="anything"
    )
    assert status == 401
    assert not fake.bot_posts()


async def test_a_thread_follow_up_without_a_mention_is_answered_after_a_restart(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    alice, channel = world(fake)
    first = await start_bot()
    post = await fake.user_posts(alice, channel, "@opsbot what changed in payments?")
    await fake.wait_for(lambda: len(answers_in(fake, post["id"])) == 1)
    await first.stop()
    second = await start_bot()  # a new process: only the store remembers the thread
    followup = await fake.user_posts(alice, channel, "and the database?", root_id=post["id"])
    await fake.wait_for(lambda: len(answers_in(fake, post["id"])) == 2)
    assert second.adapter.ws_connects >= 1
    assert followup["root_id"] == post["id"]
    # A plain reply in a thread opsbot never answered stays unanswered.
    other = await fake.user_posts(alice, channel, "unrelated top-level post")
    await fake.user_posts(alice, channel, "reply without mention", root_id=other["id"])
    probe = await fake.user_posts(alice, channel, "@opsbot probe")
    await fake.wait_for(lambda: len(answers_in(fake, probe["id"])) == 1)
    assert not [p for p in fake.bot_posts() if p["root_id"] == other["id"]]


async def test_streaming_edits_the_placeholder_at_most_once_per_edit_interval(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    alice, channel = world(fake)
    interval = 0.3
    bot = await start_bot(edit_interval_s=interval)
    post = await fake.user_posts(alice, channel, "just a post to answer")
    message = IncomingMessage(
        platform="mattermost",
        event_id=post["id"],
        channel=channel,
        user=alice,
        text="q",
        kind=MessageKind.MENTION,
        thread_id=post["id"],
        message_id=post["id"],
    )
    reply = await bot.adapter.open_reply(message)
    placeholder = bot_replies(fake, post["id"])[0]
    # Text arrives every 20 ms for about 1.5 s: far more often than edits are allowed.
    text = ""
    for i in range(75):
        text += f"token{i} "
        await reply.update(text)
        await asyncio.sleep(0.02)
    await reply.finish(FinalAnswer(request_id="req-1", text=text, ttft_ms=12.0, total_ms=1500.0))
    patches = fake.calls_to("PUT", rf"/api/v4/posts/{placeholder['id']}/patch")
    assert len(patches) >= 3, "expected intermediate edits and a final one"
    assert len(patches) <= 1.5 / interval + 2
    starts = [c.started for c in patches]
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    # Measured on the fake's own clock: the throttle keeps every gap at least the interval.
    assert min(gaps) >= interval * 0.9, gaps
    assert all(c.body["message"].endswith("▍") for c in patches[:-1])
    final = fake.posts[placeholder["id"]]["message"]
    assert final.startswith(text.strip()) and "first token 0.01 s" in final and "total 1.50 s" in final


async def test_an_answer_from_the_engine_streams_into_the_placeholder_and_ends_with_the_footer(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    alice, channel = world(fake)
    interval = 0.1
    await start_bot(max_tokens=64, edit_interval_s=interval)
    post = await fake.user_posts(alice, channel, "@opsbot tell me a long story")
    await fake.wait_for(lambda: len(answers_in(fake, post["id"])) == 1, timeout=60)
    answer = answers_in(fake, post["id"])[0]
    assert len(bot_replies(fake, post["id"])) == 1  # one post, edited in place
    patches = fake.calls_to("PUT", rf"/api/v4/posts/{answer['id']}/patch")
    starts = [c.started for c in patches]
    assert all(b - a >= interval * 0.9 for a, b in zip(starts, starts[1:], strict=False))
    assert FOOTER_MARK in patches[-1].body["message"]


async def test_a_long_answer_is_split_within_the_servers_post_limit(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    fake.max_post_size = 260  # read by the adapter from GET /config/client?format=old
    alice, channel = world(fake)
    bot = await start_bot(max_tokens=160, ignore_eos=True, edit_interval_s=0.1)  # long, whatever the model
    assert bot.adapter.max_post_size == 260
    post = await fake.user_posts(alice, channel, "@opsbot long answer please")
    await fake.wait_for(lambda: len(answers_in(fake, post["id"])) == 1, timeout=90)
    pieces = sorted((p for p in fake.bot_posts() if p["root_id"] == post["id"]), key=lambda p: p["create_at"])
    assert len(pieces) >= 2
    assert all(len(p["message"]) <= 260 for p in pieces)
    assert FOOTER_MARK in pieces[-1]["message"] and all(FOOTER_MARK not in p["message"] for p in pieces[:-1])
    assert "attachments" in pieces[-1]["props"]


async def test_a_feedback_click_is_verified_and_stored_with_the_request_id(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    alice, channel = world(fake)
    bot = await start_bot()
    post = await fake.user_posts(alice, channel, "@opsbot rate me")
    await fake.wait_for(lambda: len(answers_in(fake, post["id"])) == 1)
    answer = answers_in(fake, post["id"])[0]
    request_id = answer["props"]["attachments"][0]["actions"][0]["integration"]["context"]["request_id"]
    assert f"`{request_id}`" in answer["message"]
    status, body = await fake.click_button(answer["id"], "👎", alice)
    assert status == 200 and "ephemeral_text" in body
    rows = await _rows(bot.adapter.store, "SELECT request_id, platform, user, value FROM opsbot_feedback", 1)
    assert rows == [(request_id, "mattermost", alice, -1)]
    # A forged click (context edited to flip the vote) is refused and not stored.
    action = answer["props"]["attachments"][0]["actions"][1]
    action["integration"]["context"]["value"] = 1
    answer["props"]["attachments"][0]["actions"] = [action]
    status, _ = await fake.click_button(answer["id"], "👎", alice)
    assert status == 401
    assert ACTION_SECRET not in str(answer["props"])  # the secret itself never leaves opsbot
    rows = await _rows(bot.adapter.store, "SELECT value FROM opsbot_feedback", 1)
    assert rows == [(-1,)]


async def _rows(store: Store, sql: str, expected: int, timeout: float = 15.0) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` once there are ``expected`` of them (the store writes in the background)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        async with store.engine.connect() as conn:
            rows = [tuple(r) for r in (await conn.execute(sa.text(sql))).all()]
        if len(rows) >= expected or asyncio.get_running_loop().time() > deadline:
            return rows
        await asyncio.sleep(0.05)


async def test_outside_the_allow_lists_a_mention_and_rca_get_an_ephemeral_refusal_and_no_answer(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    alice, channel = world(fake)
    bot = await start_bot(allowed_channels=["some-other-channel"])
    post = await fake.user_posts(alice, channel, "@opsbot are you there?")
    await fake.wait_for(lambda: len(fake.ephemeral) == 1)
    refusal = fake.ephemeral[0]
    assert refusal["user_id"] == alice and "not enabled" in refusal["post"]["message"]
    assert refusal["post"]["root_id"] == post["id"]
    status, body, _ = await fake.send_slash_command(
        bot.command_url, token=SLASH_TOKEN, user_id=alice, channel_id=channel, text="why?"
    )
    assert status == 200 and body["response_type"] == "ephemeral" and "not enabled" in body["text"]
    assert not fake.bot_posts()


async def test_a_slow_rca_status_is_acked_first_and_delivered_to_the_response_url(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    alice, channel = world(fake)
    bot = await start_bot(slash_command_wait_s=0)
    status, body, _ = await fake.send_slash_command(
        bot.command_url, token=SLASH_TOKEN, user_id=alice, channel_id=channel, text="status"
    )
    assert status == 200 and body["response_type"] == "ephemeral"
    await fake.wait_for(lambda: len(fake.command_responses) == 2)
    later = fake.command_responses[1]
    assert later["response_type"] == "ephemeral" and "TTFT" in later["text"]
    assert later["_authorization"] is None  # the bot token never goes to a response URL
    assert not fake.bot_posts()
