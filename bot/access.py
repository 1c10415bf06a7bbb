"""Who opsbot answers: the one access policy for every platform.

Rules, in order: a direct message follows ``direct_messages`` (``allow``: the DM is the asker's own
space, only the user list applies; ``as_channel``: the DM must also be an allowed channel;
``deny``: never); any other channel must be in ``allowed_channels`` when that list is set; the asker
must be in ``allowed_users`` when that list is set. A refusal is one text, the same on every
platform, naming the setting an admin would change.

Adapters ask :meth:`AccessPolicy.refusal` where they must answer synchronously (a slash command's
acknowledgement carries the refusal); the pipeline asks it for every other message, after the
event is claimed, so four deliveries of one refused mention give one refusal.

**Bots never answer bots.** Before any of that, adapters pass the author of every message through
:meth:`AccessPolicy.ignores_bot`: a message written by a bot, an integration, a webhook or a
workflow is dropped silently (no refusal: a refusal would be one more bot message) unless the bot
is in ``allowed_bots`` by id or name. What makes an author a bot is read here too, once per
platform: :func:`slack_author` (any event with a ``bot_id``, with or without a subtype:
``bot_message`` integrations and workflows, other apps' bot users) and :func:`mattermost_author`
(``props.from_bot``, ``from_webhook``, ``from_plugin``, or an account whose ``is_bot`` is set).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bot.config import AccessSettings
from bot.types import IncomingMessage


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a message is not answered, as the asker should read it."""

    rule: str
    """``channel``, ``user`` or ``direct_message``."""
    text: str


@dataclass(frozen=True, slots=True)
class Author:
    """Who wrote a message, as the bot policy sees it."""

    is_bot: bool
    ids: tuple[str, ...] = ()
    """Every id the author goes by (bot id, bot user id, app id)."""
    names: tuple[str, ...] = ()
    """Every name the author goes by (username, bot / app name, webhook override name)."""
    form: str = ""
    """What kind of bot (``bot_message``, ``bot user``, ``webhook``, ...), for log lines."""


HUMAN = Author(is_bot=False)


def slack_author(event: Mapping[str, Any]) -> Author:
    """The author of a Slack message or ``app_mention`` event: a bot whenever Slack marks it as one
    (``bot_id`` with or without a subtype, the ``bot_message`` subtype, a ``bot_profile``)."""
    profile = event.get("bot_profile") if isinstance(event.get("bot_profile"), Mapping) else {}
    assert isinstance(profile, Mapping)
    if not (event.get("bot_id") or event.get("subtype") == "bot_message" or profile):
        return HUMAN
    ids = (
        event.get("bot_id"),
        event.get("user"),
        event.get("app_id"),
        profile.get("id"),
        profile.get("app_id"),
    )
    names = (event.get("username"), profile.get("name"))
    form = "bot_message" if event.get("subtype") == "bot_message" else "bot user"
    return Author(True, _present(ids), _present(names), form)


def mattermost_author(post: Mapping[str, Any], user: Mapping[str, Any] | None) -> Author:
    """The author of a Mattermost post: a bot when the server marked the post (``from_bot``,
    ``from_webhook``, ``from_plugin``) or the account is a bot account (``GET /users/{id}``)."""
    props = post.get("props") if isinstance(post.get("props"), Mapping) else {}
    assert isinstance(props, Mapping)
    marks = [
        k for k in ("from_bot", "from_webhook", "from_plugin") if str(props.get(k, "")).lower() == "true"
    ]
    is_bot_account = bool(user and user.get("is_bot"))
    if not marks and not is_bot_account:
        return HUMAN
    ids = (post.get("user_id"),)
    names = ((user or {}).get("username"), props.get("override_username"))
    form = marks[0] if marks else "bot account"
    return Author(True, _present(ids), _present(names), form)


def _present(values: tuple[object, ...]) -> tuple[str, ...]:
    return tuple(str(v) for v in values if v)


class AccessPolicy:
    """One platform's access rules (from its ``[slack]`` / ``[mattermost]`` section)."""

    def __init__(self, settings: AccessSettings, platform: str) -> None:
        self.settings = settings
        self.platform = platform

    def refusal(self, channel: str, user: str, *, direct: bool) -> Refusal | None:
        """The refusal for ``user`` asking in ``channel`` (``direct``: a DM), or ``None`` when allowed."""
        s = self.settings
        if direct and s.direct_messages == "deny":
            return Refusal(
                "direct_message",
                f":no_entry: opsbot is not enabled for direct messages here ({self.platform}."
                "direct_messages is deny); ask in an incident channel instead.",
            )
        channel_rule_applies = not direct or s.direct_messages == "as_channel"
        if channel_rule_applies and s.allowed_channels and channel not in s.allowed_channels:
            return Refusal(
                "channel",
                f":no_entry: opsbot is not enabled in this channel (it is not in {self.platform}."
                "allowed_channels); ask an admin.",
            )
        if s.allowed_users and user not in s.allowed_users:
            return Refusal(
                "user",
                f":no_entry: opsbot is not enabled for you (you are not in {self.platform}."
                "allowed_users); ask an admin.",
            )
        return None

    def ignores_bot(self, author: Author) -> bool:
        """True when ``author`` is a bot (integration, webhook, workflow) not in ``allowed_bots``."""
        if not author.is_bot:
            return False
        allowed = {a.lower() for a in self.settings.allowed_bots}
        return not any(x.lower() in allowed for x in (*author.ids, *author.names))

    def refusal_for(self, message: IncomingMessage) -> Refusal | None:
        """:meth:`refusal` for a normalised message."""
        return self.refusal(message.channel, message.user, direct=message.is_direct)
