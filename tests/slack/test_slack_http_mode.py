"""HTTP Events API mode: signed requests are served, bad or stale ones refused, retries acked once."""

from __future__ import annotations

import logging
import time

import pytest
from fakes.slack_harness import BotFactory, answers, request_rows, settled
from fakes.slack_server import FakeSlack

pytestmark = pytest.mark.timeout(120)

SECRET_TEXT = "the-body-must-never-reach-the-log"


async def test_a_bad_signature_is_refused_with_401_and_the_body_is_not_logged(
    slack: FakeSlack, make_bot: BotFactory, caplog: pytest.LogCaptureFixture
) -> None:
    bot = await make_bot(mode="http")
    caplog.set_level(logging.DEBUG)
    event = slack.user_message("D1", "U1", SECRET_TEXT, channel_type="im")
    post = await slack.post_to_app(
        bot.events_url, "event", slack.event_callback(event), secret="wrong-secret"
    )
    assert post.status == 401
    assert "bad signature" in caplog.text
    assert SECRET_TEXT not in caplog.text
    await settled(bot)
    assert slack.bot_messages() == []


async def test_a_stale_timestamp_is_refused_with_401_even_when_correctly_signed(
    slack: FakeSlack, make_bot: BotFactory, caplog: pytest.LogCaptureFixture
) -> None:
    bot = await make_bot(mode="http")
    caplog.set_level(logging.DEBUG)
    event = slack.user_message("D1", "U1", SECRET_TEXT, channel_type="im")
    stale = int(time.time()) - 6 * 60
    post = await slack.post_to_app(bot.events_url, "event", slack.event_callback(event), timestamp=stale)
    assert post.status == 401
    assert "stale timestamp" in caplog.text
    assert SECRET_TEXT not in caplog.text
    assert slack.bot_messages() == []


async def test_http_url_verification_challenge_is_answered(slack: FakeSlack, make_bot: BotFactory) -> None:
    bot = await make_bot(mode="http")
    body = {"token": "t", "challenge": "chal-123", "type": "url_verification"}
    post = await slack.post_to_app(bot.events_url, "event", body)
    assert post.status == 200 and "chal-123" in post.body


async def test_http_mention_with_slack_retries_is_acked_every_time_and_answered_once(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot(mode="http")
    event = slack.user_message("C1", "U1", f"<@{slack.bot_user_id}> is the ingress healthy?")
    for e in slack.mention_events(event):
        callback = slack.event_callback(e)
        for retry in (None, 1, 2, 3):  # X-Slack-Retry-Num on the redeliveries
            post = await slack.post_to_app(bot.events_url, "event", callback, retry_num=retry)
            assert post.status == 200
    await slack.wait_for(lambda: len(answers(slack, "C1")) == 1)
    await settled(bot)
    assert len(slack.bot_messages("C1")) == 1
    assert len(await request_rows(bot.store)) == 1


async def test_http_rca_is_acked_before_the_answer_and_feedback_clicks_are_accepted(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot(mode="http")
    post = await slack.post_to_app(
        bot.events_url, "command", slack.slash_command("C1", "U3", "orders lagging")
    )
    assert post.status == 200
    assert post.answered_at - post.sent_at < 3.0
    await slack.wait_for(lambda: len(answers(slack, "C1")) == 1)
    answer = answers(slack, "C1")[0]
    action = next(
        e["action_id"] for b in answer.blocks or [] if b["type"] == "actions" for e in b["elements"]
    )
    click = await slack.post_to_app(
        bot.events_url, "interactive", slack.block_action(answer, "U3", action, "1")
    )
    assert click.status == 200
