"""``--post platform:channel``: the report's summary as a chat thread, through the real adapter.

A header message starts the thread in the channel; the summary (top groups with the start of their
summaries, what changed) follows in that thread, split to the platform's message size. Standalone
(``opsbot analyze``) the adapter is built from the configuration only to post (no Socket Mode or
websocket is opened); inside a running bot the bot's own connected adapter posts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from bot.adapters.base import ChatAdapter
from bot.adapters.streaming import split_text
from bot.analyze.report import chat_summary
from bot.config import Settings
from bot.store import Store

MESSAGE_LIMIT = 3500
"""Characters per thread message: long enough for a few groups, short enough to read in a thread."""


class ChannelPoster(Protocol):
    """The part of :class:`bot.adapters.base.ChatAdapter` posting needs."""

    platform: str

    async def post_to_channel(self, channel: str, text: str, thread_id: str | None = None) -> str:
        """Post a message; returns its id (the thread id for replies)."""


def parse_target(target: str) -> tuple[str, str]:
    """``slack:C123`` -> (``slack``, ``C123``); :class:`ValueError` naming the expected shape."""
    platform, _, channel = target.partition(":")
    if platform not in ("slack", "mattermost") or not channel:
        raise ValueError(f"--post {target!r}: expected slack:CHANNEL or mattermost:CHANNEL")
    return platform, channel


async def post_summary(
    poster: ChannelPoster, channel: str, report: Mapping[str, Any], *, report_path: str | None = None
) -> str:
    """Post the header, then the summary into its thread; returns the thread id."""
    header, body = chat_summary(report, report_path=report_path)
    thread = await poster.post_to_channel(channel, header)
    for chunk in split_text(body, MESSAGE_LIMIT):
        await poster.post_to_channel(channel, chunk, thread)
    return thread


class PostingAdapter:
    """A platform adapter opened for posting only (standalone ``--post``); ``async with`` closes it."""

    def __init__(self, settings: Settings, platform: str, store: Store) -> None:
        self.platform = platform
        self.adapter: ChatAdapter
        if platform == "slack":
            from bot.adapters.slack import SlackAdapter

            if settings.slack.bot_token is None:
                raise ValueError("--post slack:...: slack.bot_token (OPSBOT_SLACK__BOT_TOKEN) is not set")
            self.adapter = SlackAdapter(settings.slack, store)
        else:
            from bot.adapters.mattermost import MattermostAdapter

            if settings.mattermost.token is None:
                raise ValueError(
                    "--post mattermost:...: mattermost.token (OPSBOT_MATTERMOST__TOKEN) is not set"
                )
            self.adapter = MattermostAdapter(settings.mattermost, store)

    async def __aenter__(self) -> ChatAdapter:
        if self.platform == "mattermost":
            from bot.adapters.mattermost import MattermostAdapter

            assert isinstance(self.adapter, MattermostAdapter)
            # Posting needs the REST session only; start() would also open the websocket.
            await self.adapter.rest.start()
        return self.adapter

    async def __aexit__(self, *exc: object) -> None:
        await self.adapter.close()
