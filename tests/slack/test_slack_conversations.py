"""Mentions, DMs, ``/rca``, follow-ups and feedback, end to end: fake Slack -> real slack-bolt /
slack-sdk -> adapter -> pipeline -> CPU engine on the tiny model -> store -> back to the fake."""

from __future__ import annotations

import pytest
from fakes.slack_harness import (
    BotFactory,
    answers,
    feedback_action_ids,
    request_rows,
    settled,
    stop_bot,
)
from fakes.slack_server import FakeSlack
from sqlalchemy import select

from bot.store.models import FeedbackRow

pytestmark = pytest.mark.timeout(120)


async def test_mention_is_answered_once_in_the_thread_of_the_message(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot()
    event = slack.user_message("C1", "U1", f"<@{slack.bot_user_id}> why is checkout returning 502?")
    for e in slack.mention_events(event):  # Slack sends app_mention AND message for one mention
        await slack.deliver_event(e)
    await slack.wait_for(lambda: len(answers(slack, "C1")) == 1)
    await slack.wait_for(lambda: all(env.acked_at for env in slack.envelopes.values()))
    await settled(bot)
    (answer,) = answers(slack, "C1")
    assert answer.thread_ts == event["ts"]
    assert len(slack.bot_messages("C1")) == 1
    ids = feedback_action_ids(answer)
    assert len(ids) == 2 and all(":" in i for i in ids)
    assert len(await request_rows(bot.store)) == 1


async def test_mention_inside_a_thread_is_answered_in_that_thread(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    await make_bot()
    parent = slack.user_message("C1", "U1", "pods are crashlooping in prod")
    reply = slack.user_message("C1", "U2", f"<@{slack.bot_user_id}> any idea?", thread_ts=parent["ts"])
    for e in slack.mention_events(reply):
        await slack.deliver_event(e)
    await slack.wait_for(lambda: len(answers(slack, "C1")) == 1)
    assert answers(slack, "C1")[0].thread_ts == parent["ts"]


async def test_direct_message_is_answered_in_its_thread(slack: FakeSlack, make_bot: BotFactory) -> None:
    await make_bot()
    event = slack.user_message("D1", "U1", "what is using the most memory?", channel_type="im")
    await slack.deliver_event(event)
    await slack.wait_for(lambda: len(answers(slack, "D1")) == 1)
    assert answers(slack, "D1")[0].thread_ts == event["ts"]


async def test_bot_messages_edits_and_deletions_are_not_answered(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot()
    dm = slack.user_message("D1", "U1", "hello", channel_type="im")
    edited = {**dm, "subtype": "message_changed", "message": {"text": "hello again"}}
    deleted = {**dm, "subtype": "message_deleted"}
    own = {**dm, "user": slack.bot_user_id, "bot_id": slack.bot_id, "ts": slack.new_ts()}
    other_bot = {**dm, "subtype": "bot_message", "bot_id": "B0OTHER", "ts": slack.new_ts()}
    for e in (edited, deleted, own, other_bot):
        await slack.deliver_event(e)
    await slack.wait_for(lambda: all(env.acked_at for env in slack.envelopes.values()))
    await settled(bot)
    assert slack.bot_messages() == []


async def test_rca_is_acked_then_answered_in_a_thread_under_a_message_quoting_it(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot()
    env = await slack.deliver("slash_commands", slack.slash_command("C1", "U7", "payments-api 5xx spike"))
    await slack.wait_for(lambda: len(answers(slack, "C1")) == 1)
    assert env.acked_at is not None and env.sent_at is not None
    assert env.acked_at - env.sent_at < 3.0
    quote = next(m for m in slack.bot_messages("C1") if m.thread_ts is None)
    assert "<@U7>" in quote.text and "payments-api 5xx spike" in quote.text
    assert answers(slack, "C1")[0].thread_ts == quote.ts
    await settled(bot)
    rows = await request_rows(bot.store)
    assert [(r[0], r[1]) for r in rows] == [("C1", quote.ts)]


@pytest.mark.parametrize("word", ["help", "status"])
async def test_rca_help_and_status_are_answered_ephemerally(
    slack: FakeSlack, make_bot: BotFactory, word: str
) -> None:
    await make_bot()
    env = await slack.deliver("slash_commands", slack.slash_command("C1", "U7", word))
    # The text rides on the command's ack (only the person who typed it sees it): no API call.
    await slack.wait_for(lambda: env.acked_at is not None)
    expected = "*opsbot* — incident assistant" if word == "help" else "*opsbot status*"
    assert (env.ack_payload or {}).get("text", "").startswith(expected)
    assert slack.bot_messages() == [] and slack.ephemerals == []


async def test_follow_up_in_a_bot_thread_is_answered_after_a_restart(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot()
    first = slack.user_message("C1", "U1", f"<@{slack.bot_user_id}> is redis healthy?")
    await slack.deliver_event(slack.mention_events(first)[0])
    await slack.wait_for(lambda: len(answers(slack, "C1")) == 1)
    await stop_bot(bot)  # restart: new adapter, new store on the same SQLite file

    bot = await make_bot()
    follow = slack.user_message("C1", "U1", "and what about its memory?", thread_ts=first["ts"])
    await slack.deliver_event(follow)  # no mention: only the message event arrives
    await slack.wait_for(lambda: len(answers(slack, "C1")) == 2)
    assert {m.thread_ts for m in answers(slack, "C1")} == {first["ts"]}

    unrelated = slack.user_message("C1", "U1", "lunch?", thread_ts=slack.user_message("C1", "U2", "hi")["ts"])
    await slack.deliver_event(unrelated)
    await slack.wait_for(lambda: all(env.acked_at for env in slack.envelopes.values()))
    await settled(bot)
    assert len(answers(slack, "C1")) == 2


async def test_feedback_click_is_stored_with_the_request_id(slack: FakeSlack, make_bot: BotFactory) -> None:
    bot = await make_bot()
    await slack.deliver_event(slack.user_message("D1", "U1", "hi", channel_type="im"))
    await slack.wait_for(lambda: len(answers(slack, "D1")) == 1)
    answer = answers(slack, "D1")[0]
    up = next(i for i in feedback_action_ids(answer) if i.startswith("opsbot_feedback_up"))
    request_id = up.split(":", 1)[1]
    env = await slack.deliver("interactive", slack.block_action(answer, "U1", up, "1"))
    await slack.wait_for(lambda: env.acked_at is not None)
    await settled(bot)
    assert bot.store is not None

    async def stored() -> list[tuple[str, int]]:
        await request_rows(bot.store)  # waits for the buffer to flush
        async with bot.store.engine.connect() as conn:
            rows = (await conn.execute(select(FeedbackRow.request_id, FeedbackRow.value))).all()
        return [(r[0], r[1]) for r in rows]

    assert await stored() == [(request_id, 1)]


async def test_refusals_outside_the_allow_lists_are_ephemeral_and_say_why(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot(allowed_channels=["C1"], allowed_users=["U1"])
    event = slack.user_message("C2", "U1", f"<@{slack.bot_user_id}> hello")
    await slack.deliver_event(slack.mention_events(event)[0], copies=2)
    env = await slack.deliver("slash_commands", slack.slash_command("C1", "U9", "db down"))
    await slack.wait_for(lambda: len(slack.ephemerals) == 1 and env.acked_at is not None)
    await settled(bot)
    assert "allowed_channels" in slack.ephemerals[0]["text"]
    assert "allowed_users" in (env.ack_payload or {}).get("text", "")
    assert slack.bot_messages() == []


async def test_a_reply_in_the_thread_of_a_refused_question_is_not_answered(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    """The refused question's claim named its thread; released unanswered, it no longer makes
    that thread the bot's, so a reply there without a mention stays between people."""
    bot = await make_bot(allowed_users=["U1"])
    asked = slack.user_message("C1", "U9", f"<@{slack.bot_user_id}> restart the db?")
    await slack.deliver_event(slack.mention_events(asked)[0])
    await slack.wait_for(lambda: len(slack.ephemerals) == 1)
    await settled(bot)
    assert bot.store is not None
    await request_rows(bot.store)  # the release is written
    await slack.deliver_event(slack.user_message("C1", "U1", "no, wait for the DBA", thread_ts=asked["ts"]))
    # A question asked after the reply is answered once the reply has been looked at and left.
    control = slack.user_message("C2", "U1", f"<@{slack.bot_user_id}> is redis healthy?")
    await slack.deliver_event(slack.mention_events(control)[0])
    await slack.wait_for(lambda: len(answers(slack, "C2")) == 1)
    await settled(bot)
    assert answers(slack, "C1") == [] and len(slack.ephemerals) == 1


async def test_a_wrong_app_token_fails_start_with_slacks_error(slack: FakeSlack) -> None:
    from fakes.slack_harness import slack_settings

    from bot.adapters.slack import SlackAdapter
    from bot.adapters.slack_api import SlackCallError

    adapter = SlackAdapter(slack_settings(slack, app_token="xapp-wrong"), store=None)  # type: ignore[arg-type]

    async def never(_: object) -> None:
        raise AssertionError("no message expected")

    with pytest.raises(SlackCallError, match="apps.connections.open: invalid_auth"):
        await adapter.start(never)
    await adapter.stop()  # nothing was opened: stop is a no-op
