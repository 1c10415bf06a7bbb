"""Bots never answer bots: every form in which Slack delivers a bot's message is ignored, unless
``allowed_bots`` names the bot (by id or name)."""

from __future__ import annotations

from typing import Any

import pytest
from fakes.slack_harness import BotFactory, answers, settled
from fakes.slack_server import FakeSlack

pytestmark = pytest.mark.timeout(120)

ALERTBOT = {"bot_id": "B0ALERT", "app_id": "A0ALERT", "name": "alertbot", "user": "U0ALERTBOT"}


def _bot_event(
    slack: FakeSlack, form: str, channel: str, text: str, thread_ts: str | None = None
) -> dict[str, Any]:
    """The message event Slack sends when a bot posts ``text`` in the given form."""
    kwargs: dict[str, Any] = {"thread_ts": thread_ts}
    if channel.startswith("D"):
        kwargs["channel_type"] = "im"
    event = slack.user_message(channel, ALERTBOT["user"], text, **kwargs)
    profile = {"id": ALERTBOT["bot_id"], "app_id": ALERTBOT["app_id"], "name": ALERTBOT["name"]}
    if form == "other app's bot user":  # chat.postMessage by another app: bot_id and user, no subtype
        event.update(bot_id=ALERTBOT["bot_id"], app_id=ALERTBOT["app_id"], bot_profile=profile)
    elif form == "bot_message integration":  # incoming webhook / legacy integration: no user at all
        del event["user"]
        event.update(subtype="bot_message", bot_id="B0HOOK", username="deploy-hook")
    elif form == "workflow post":  # Workflow Builder: a bot_message with the workflow's bot profile
        del event["user"]
        event.update(
            subtype="bot_message",
            bot_id="B0WORKFLOW",
            bot_profile={"id": "B0WORKFLOW", "name": "Incident intake", "app_id": "A0WORKFLOWS"},
        )
    elif form == "bot profile only":  # a workflow step posting as its app: bot_id + bot_profile, no subtype
        event.update(bot_id="B0STEP", bot_profile={"id": "B0STEP", "name": "step", "app_id": "A0STEP"})
    else:
        raise AssertionError(form)
    return event


FORMS = ["other app's bot user", "bot_message integration", "workflow post", "bot profile only"]


@pytest.mark.parametrize("form", FORMS)
async def test_a_bot_mentioning_opsbot_in_a_channel_or_a_dm_is_not_answered(
    slack: FakeSlack, make_bot: BotFactory, form: str
) -> None:
    bot = await make_bot()
    mention = _bot_event(slack, form, "C1", f"<@{slack.bot_user_id}> CPU is at 95 %")
    for event in slack.mention_events(mention):  # app_mention and message, as Slack sends them
        await slack.deliver_event(event)
    await slack.deliver_event(_bot_event(slack, form, "D1", "CPU is at 95 %"))
    probe = slack.user_message("C1", "U1", f"<@{slack.bot_user_id}> is the API up?")
    await slack.deliver_event(slack.mention_events(probe)[0])
    await slack.wait_for(lambda: len(answers(slack)) == 1)  # the human is answered, so events flowed
    await slack.wait_for(lambda: all(env.acked_at for env in slack.envelopes.values()))
    await settled(bot)
    assert [m.thread_ts for m in slack.bot_messages()] == [probe["ts"]]


async def test_another_bots_reply_in_a_thread_opsbot_answered_gets_no_answer(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot()
    question = slack.user_message("C1", "U1", f"<@{slack.bot_user_id}> why is checkout failing?")
    await slack.deliver_event(slack.mention_events(question)[0])
    await slack.wait_for(lambda: len(answers(slack, "C1")) == 1)
    # an alert bot chimes in, in opsbot's thread, without a mention: the loop the issue saw
    await slack.deliver_event(
        _bot_event(slack, "other app's bot user", "C1", "ALERT resolved", question["ts"])
    )
    human = slack.user_message("C1", "U1", "and the database?", thread_ts=question["ts"])
    await slack.deliver_event(human)
    await slack.wait_for(lambda: len(answers(slack, "C1")) == 2)
    await slack.wait_for(lambda: all(env.acked_at for env in slack.envelopes.values()))
    await settled(bot)
    assert len(slack.bot_messages("C1")) == 2


@pytest.mark.parametrize(
    ("form", "allowed"),
    [
        ("other app's bot user", "alertbot"),  # by bot name
        ("other app's bot user", "U0ALERTBOT"),  # by bot user id
        ("bot_message integration", "B0HOOK"),  # by bot id
        ("bot_message integration", "deploy-hook"),  # by the integration's username
    ],
)
async def test_an_allow_listed_bot_is_answered(
    slack: FakeSlack, make_bot: BotFactory, form: str, allowed: str
) -> None:
    bot = await make_bot(allowed_bots=[allowed])
    mention = _bot_event(slack, form, "C1", f"<@{slack.bot_user_id}> summarise the alert")
    for event in slack.mention_events(mention):
        await slack.deliver_event(event)
    await slack.wait_for(lambda: len(answers(slack, "C1")) == 1)
    await settled(bot)
    assert [m.thread_ts for m in slack.bot_messages("C1")] == [mention["ts"]]
