"""Bots never answer bots on Mattermost: posts marked by the server (``from_bot``, ``from_webhook``,
``from_plugin``) and posts of bot accounts (``GET /users/{id}``: ``is_bot``) are ignored, unless
``allowed_bots`` names the bot."""

from __future__ import annotations

from typing import Any

import pytest
from fakes.mattermost_server import FakeMattermost
from mm_helpers import BotFactory

FOOTER_MARK = "request `"


def answered(fake: FakeMattermost, root: str) -> bool:
    return any(p["root_id"] == root and FOOTER_MARK in p["message"] for p in fake.bot_posts())


def replies(fake: FakeMattermost, root: str) -> list[dict[str, Any]]:
    return [p for p in fake.bot_posts() if p["root_id"] == root]


@pytest.mark.parametrize(
    "form",
    [
        "bot account (server marks from_bot)",
        "bot account without from_bot (only GET /users tells)",
        "incoming webhook (from_webhook)",
        "plugin post (from_plugin)",
    ],
)
async def test_a_bot_mentioning_opsbot_is_not_answered(
    fake: FakeMattermost, start_bot: BotFactory, form: str
) -> None:
    alice = fake.add_user("alice")
    alertbot = fake.add_user("alertbot", is_bot=True)
    channel = fake.add_channel("incidents", [alice, alertbot, fake.bot_user_id])
    await start_bot()
    if form.startswith("bot account (server"):
        post = await fake.user_posts(alertbot, channel, "@opsbot disk full on db-1")
    elif form.startswith("bot account without"):
        post = await fake.user_posts(alertbot, channel, "@opsbot disk full on db-1", mark_bot=False)
        assert "from_bot" not in post["props"]
    elif form.startswith("incoming webhook"):
        # a webhook posts as the user who made it (a person), marked from_webhook by the server
        props = {"from_webhook": "true", "override_username": "grafana"}
        post = await fake.user_posts(alice, channel, "@opsbot disk full on db-1", props=props)
    else:
        post = await fake.user_posts(alice, channel, "@opsbot disk full", props={"from_plugin": "true"})
    probe = await fake.user_posts(alice, channel, "@opsbot is the API up?")
    await fake.wait_for(lambda: answered(fake, probe["id"]))
    assert replies(fake, post["id"]) == []


async def test_another_bots_reply_in_a_thread_opsbot_answered_gets_no_answer(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    alice = fake.add_user("alice")
    alertbot = fake.add_user("alertbot", is_bot=True)
    channel = fake.add_channel("incidents", [alice, alertbot, fake.bot_user_id])
    await start_bot()
    question = await fake.user_posts(alice, channel, "@opsbot why is checkout failing?")
    await fake.wait_for(lambda: answered(fake, question["id"]))
    await fake.user_posts(alertbot, channel, "ALERT resolved", root_id=question["id"], mark_bot=False)
    await fake.user_posts(alice, channel, "and the database?", root_id=question["id"])
    await fake.wait_for(lambda: sum(FOOTER_MARK in p["message"] for p in replies(fake, question["id"])) == 2)
    assert len(replies(fake, question["id"])) == 2  # one per human message, none for the bot


@pytest.mark.parametrize("by", ["username", "id"])
async def test_an_allow_listed_bot_is_answered(fake: FakeMattermost, start_bot: BotFactory, by: str) -> None:
    alertbot = fake.add_user("alertbot", is_bot=True)
    channel = fake.add_channel("incidents", [alertbot, fake.bot_user_id])
    await start_bot(allowed_bots=["alertbot" if by == "username" else alertbot])
    post = await fake.user_posts(alertbot, channel, "@opsbot summarise the alert")
    await fake.wait_for(lambda: answered(fake, post["id"]))
    assert len(replies(fake, post["id"])) == 1
