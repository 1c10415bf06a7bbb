"""The access policy on Slack: DMs follow `direct_messages`, the same rules as on Mattermost."""

from __future__ import annotations

import pytest
from fakes.slack_harness import BotFactory, answers, settled
from fakes.slack_server import FakeSlack

pytestmark = pytest.mark.timeout(120)


async def test_a_dm_is_answered_outside_the_channel_list_by_default(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot(allowed_channels=["C1"])
    await slack.deliver_event(slack.user_message("D1", "U1", "is the api healthy?", channel_type="im"))
    await slack.wait_for(lambda: len(answers(slack, "D1")) == 1)
    await settled(bot)
    assert slack.ephemerals == []


async def test_with_dms_as_channels_a_dm_outside_the_list_is_refused_once(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot(allowed_channels=["C1"], direct_messages="as_channel")
    event = slack.user_message("D1", "U1", "is the api healthy?", channel_type="im")
    await slack.deliver_event(event, copies=2)
    await slack.wait_for(lambda: len(slack.ephemerals) == 1)
    await settled(bot)
    assert "slack.allowed_channels" in slack.ephemerals[0]["text"]
    assert answers(slack) == [] and len(slack.ephemerals) == 1


async def test_with_dms_denied_a_dm_gets_the_refusal_and_no_answer(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot(direct_messages="deny")
    await slack.deliver_event(slack.user_message("D1", "U1", "hello", channel_type="im"))
    await slack.wait_for(lambda: len(slack.ephemerals) == 1)
    await settled(bot)
    assert "slack.direct_messages" in slack.ephemerals[0]["text"] and answers(slack) == []
