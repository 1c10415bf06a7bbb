"""Who opsbot answers: the one access policy for every platform.

Rules, in order: a direct message follows ``direct_messages`` (``allow``: the DM is the asker's own
space, only the user list applies; ``as_channel``: the DM must also be an allowed channel;
``deny``: never); any other channel must be in ``allowed_channels`` when that list is set; the asker
must be in ``allowed_users`` when that list is set. A refusal is one text, the same on every
platform, naming the setting an admin would change.

Adapters ask :meth:`AccessPolicy.refusal` where they must answer synchronously (a slash command's
acknowledgement carries the refusal); the pipeline asks it for every other message, after the
event is claimed, so four deliveries of one refused mention give one refusal.
"""

from __future__ import annotations

from dataclasses import dataclass

from bot.config import AccessSettings
from bot.types import IncomingMessage


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a message is not answered, as the asker should read it."""

    rule: str
    """``channel``, ``user`` or ``direct_message``."""
    text: str


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

    def refusal_for(self, message: IncomingMessage) -> Refusal | None:
        """:meth:`refusal` for a normalised message."""
        return self.refusal(message.channel, message.user, direct=message.is_direct)
