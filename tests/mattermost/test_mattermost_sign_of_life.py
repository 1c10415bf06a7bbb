"""A sign of life that spends no channel post on Mattermost: a reaction (``POST /reactions``) on the
asking post before anything slow, swapped for a done / failed reaction when the answer ends."""

from __future__ import annotations

from fakes.mattermost_server import FakeMattermost
from fakes.paced_engine import FailingEngine
from mm_helpers import BotFactory

FOOTER_MARK = "request `"


def answered(fake: FakeMattermost, root: str) -> bool:
    return any(p["root_id"] == root and FOOTER_MARK in p["message"] for p in fake.bot_posts())


async def test_eyes_come_before_the_answer_and_are_swapped_for_a_check_mark(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    alice = fake.add_user("alice")
    channel = fake.add_channel("incidents", [alice, fake.bot_user_id])
    await start_bot(post_placeholder="auto")
    post = await fake.user_posts(alice, channel, "@opsbot why is checkout slow?")
    await fake.wait_for(lambda: answered(fake, post["id"]))
    await fake.wait_for(lambda: fake.reaction_names(post["id"]) == ["white_check_mark"])
    assert [(op, emoji) for _, op, p, emoji in fake.reaction_log if p == post["id"]] == [
        ("add", "eyes"),
        ("remove", "eyes"),
        ("add", "white_check_mark"),
    ]
    assert fake.reaction_names(post["id"]) == ["white_check_mark"]
    reacted = next(t for t, op, p, _ in fake.reaction_log if p == post["id"])
    first_post = next(c for c in fake.calls_to("POST", "/api/v4/posts") if c.body["root_id"] == post["id"])
    assert reacted < first_post.started  # before the answer's first post
    assert [p for p in fake.bot_posts() if p["root_id"] == post["id"]][0]["message"] != "_thinking…_"


async def test_a_failed_answer_ends_with_the_failed_reaction(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    alice = fake.add_user("alice")
    channel = fake.add_channel("incidents", [alice, fake.bot_user_id])
    await start_bot(post_placeholder="auto", wrap_engine=FailingEngine)
    post = await fake.user_posts(alice, channel, "@opsbot why is checkout slow?")
    await fake.wait_for(lambda: answered(fake, post["id"]))
    await fake.wait_for(lambda: fake.reaction_names(post["id"]) == ["warning"])


async def test_without_a_reaction_the_placeholder_post_is_the_sign_of_life(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    alice = fake.add_user("alice")
    channel = fake.add_channel("incidents", [alice, fake.bot_user_id])
    await start_bot(post_placeholder="auto", ack_reaction="")
    post = await fake.user_posts(alice, channel, "@opsbot why is checkout slow?")
    await fake.wait_for(lambda: answered(fake, post["id"]))
    assert fake.reaction_log == []
    first_post = next(c for c in fake.calls_to("POST", "/api/v4/posts") if c.body["root_id"] == post["id"])
    assert first_post.body["message"] == "_thinking…_"
