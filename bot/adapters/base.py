"""The chat seam: ``ChatAdapter`` (connect, listen, reply) and ``ReplyStream`` (one streamed answer).

An adapter verifies, de-duplicates (through the pipeline's store), acknowledges fast and hands a
normalised :class:`~bot.types.IncomingMessage` to the handler it was started with. To answer,
the pipeline opens a :class:`ReplyStream` (placeholder posted at once), pushes the growing text
(the stream throttles edits to the platform's limits) and finishes with a
:class:`~bot.types.FinalAnswer` (split to size, footer, feedback buttons).
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable

from aiohttp import web

from bot.types import FinalAnswer, IncomingMessage

MessageHandler = Callable[[IncomingMessage], Awaitable[None]]
"""What an adapter calls for every accepted message; it returns once the answer is delivered."""


class ReplyStream(abc.ABC):
    """One answer being streamed into a thread."""

    @abc.abstractmethod
    async def update(self, text: str) -> None:
        """The whole answer so far; the stream decides when to edit (throttled)."""

    @abc.abstractmethod
    async def finish(self, answer: FinalAnswer) -> None:
        """Final edit(s): full text split to the platform's limits, footer, buttons."""

    @property
    @abc.abstractmethod
    def thread_id(self) -> str:
        """Platform id of the thread the answer lives in."""


class ChatAdapter(abc.ABC):
    """A chat platform connection (Slack, Mattermost, terminal)."""

    platform: str = "abstract"

    @abc.abstractmethod
    async def start(self, handler: MessageHandler) -> None:
        """Connect and begin delivering messages to ``handler``; returns once listening."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Disconnect; pending replies are flushed first where the platform allows."""

    @abc.abstractmethod
    async def open_reply(self, message: IncomingMessage) -> ReplyStream:
        """Post the placeholder for ``message``'s answer and return the stream that edits it."""

    @abc.abstractmethod
    async def send_notice(self, message: IncomingMessage, text: str, *, ephemeral: bool = False) -> None:
        """A short non-streamed message (refusals, help, status); ephemeral where supported."""

    def http_routes(self) -> list[web.RouteDef]:
        """Routes this adapter serves on opsbot's HTTP server (events, slash commands, actions)."""
        return []

    async def post_to_channel(self, channel: str, text: str, thread_id: str | None = None) -> str:
        """Post a plain message (alert threads); returns its id (the thread id for replies)."""
        raise NotImplementedError(f"{self.platform} cannot post to channels")
