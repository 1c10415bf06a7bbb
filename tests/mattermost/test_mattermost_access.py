"""The access policy on Mattermost: DMs follow `direct_messages`, the same rules as on Slack."""

from __future__ import annotations

from fakes.mattermost_server import FakeMattermost
from mm_helpers import BotFactory

FOOTER_MARK = "request `"


def answers(fake: FakeMattermost, channel: str) -> list[dict[str, object]]:
    return [p for p in fake.bot_posts() if p["channel_id"] == channel and FOOTER_MARK in str(p["message"])]


async def test_a_dm_is_answered_outside_the_channel_list_by_default(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    bob = fake.add_user("bob")
    dm = fake.add_dm(bob)
    await start_bot(allowed_channels=["some-incident-channel"])
    await fake.user_posts(bob, dm, "is the api healthy?")
    await fake.wait_for(lambda: len(answers(fake, dm)) == 1)
    assert fake.ephemeral == []


async def test_with_dms_as_channels_a_dm_outside_the_list_is_refused(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    bob = fake.add_user("bob")
    dm = fake.add_dm(bob)
    await start_bot(allowed_channels=["some-incident-channel"], direct_messages="as_channel")
    await fake.user_posts(bob, dm, "is the api healthy?")
    await fake.wait_for(lambda: len(fake.ephemeral) == 1)
    assert "mattermost.allowed_channels" in fake.ephemeral[0]["post"]["message"]
    assert answers(fake, dm) == []


async def test_with_dms_denied_a_dm_gets_the_refusal_and_no_answer(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    bob = fake.add_user("bob")
    dm = fake.add_dm(bob)
    await start_bot(direct_messages="deny")
    await fake.user_posts(bob, dm, "hello")
    await fake.wait_for(lambda: len(fake.ephemeral) == 1)
    assert "mattermost.direct_messages" in fake.ephemeral[0]["post"]["message"]
    assert answers(fake, dm) == []
