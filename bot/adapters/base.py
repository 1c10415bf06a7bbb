"""The chat seam: ``ChatAdapter`` (connect, listen, reply) and ``ReplyStream`` (one streamed answer).

An adapter verifies, acknowledges fast, normalises each event to a
:class:`~bot.types.IncomingMessage` and hands it to the pipeline's ``submit`` (the
:data:`MessageSink` it was started with), which owns it from then on: claim, access policy,
answer. To answer, the pipeline opens a :class:`ReplyStream` (placeholder posted at once), pushes
the growing text (the stream throttles edits to the platform's limits) and finishes with a
:class:`~bot.types.FinalAnswer` (split to size, footer, feedback buttons).

Shutdown has two steps so answers in flight can still post: :meth:`ChatAdapter.stop` stops taking
messages, the pipeline drains, then :meth:`ChatAdapter.close` releases the connections. Failed
platform calls raise :mod:`bot.errors`' ``PlatformError`` branches.

A sign of life comes before any of that: :meth:`ChatAdapter.acknowledge` (a reaction on the asking
message, or an assistant thread's status) before context gathering starts, and
:meth:`ChatAdapter.conclude` swaps it for a done / failed mark when the answer ends. Both are best
effort and spend no channel post.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web

from bot.access import AccessPolicy
from bot.event_loop import stop_task
from bot.types import FinalAnswer, IncomingMessage, SourceNote, StepUpdate, ThreadRead

logger = logging.getLogger(__name__)

MessageSink = Callable[[IncomingMessage], "asyncio.Task[None]"]
"""``pipeline.submit`` bound to an adapter: takes an accepted message and returns the task that
answers it (the terminal awaits it; platforms do not)."""


class Housekeeping:
    """Best-effort work an adapter does after an answer ended (swapping the sign-of-life reaction for
    a done mark), one job at a time in one background task, so it waits for rate budget as long as
    it must without holding the answer (or the pipeline's drain) up. Jobs left at :meth:`close`
    are dropped: they are cosmetic."""

    def __init__(self, name: str, max_jobs: int = 10_000) -> None:
        self.name = name
        self._queue: asyncio.Queue[Callable[[], Awaitable[None]]] = asyncio.Queue(max_jobs)
        self._task: asyncio.Task[None] | None = None
        self.done = 0
        """Jobs completed (for tests and logs)."""

    def add(self, job: Callable[[], Awaitable[None]]) -> None:
        """Queue ``job`` (dropped with a log line when the queue is full)."""
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            logger.warning("%s: housekeeping queue full; a job was dropped", self.name)
            return
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"{self.name}-housekeeping")

    @property
    def pending(self) -> int:
        """Jobs not done yet."""
        return self._queue.qsize()

    async def _run(self) -> None:
        while True:
            job = await self._queue.get()
            try:
                await job()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("%s: housekeeping job failed", self.name, exc_info=True)
            self.done += 1

    async def close(self) -> None:
        """Stop; jobs not done yet are dropped (logged)."""
        await stop_task(self._task)
        if self._queue.qsize():
            logger.info("%s: %d housekeeping job(s) dropped at close", self.name, self._queue.qsize())


def cancel_pending(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel each of ``tasks`` that is still running (a reply's edit loop, a call in flight)."""
    for task in tasks:
        if task is not None and not task.done():
            task.cancel()


class ReplyStream(abc.ABC):
    """One answer being streamed into a thread."""

    first_visible_at: float | None = None
    """``time.perf_counter()`` when answer text (not the placeholder) first reached the platform, set
    by the stream (``opsbot_first_visible_token_seconds``)."""

    @abc.abstractmethod
    async def update(self, text: str) -> None:
        """The whole answer so far; the stream decides when to edit (throttled)."""

    @abc.abstractmethod
    async def finish(self, answer: FinalAnswer) -> None:
        """Final edit(s): full text split to the platform's limits, footer, buttons."""

    async def show_sources(self, sources: Sequence[SourceNote]) -> None:
        """Context gathering is done: show what each source gave (Slack's native stream shows them
        as task updates); default: nothing, the footer lists them."""
        return None

    steps_in_text: bool = True
    """Whether the investigation's checklist is shown in the streamed text (edited replies, the
    eval); ``False`` where the platform shows steps itself (Slack's native task updates)."""

    async def show_step(self, step: StepUpdate, checklist: str) -> None:
        """An investigation step started or ended (``checklist``: every step so far, one line each).
        Default: the checklist is the reply's text until the answer's first words replace it (the
        stream's own edit pacing and rate budget apply)."""
        await self.update(checklist)

    def seconds_to_next_edit(self) -> float:
        """How long until this stream sends answer text again, in seconds (0: it would now). The
        pipeline redacts and hands over partial text only shortly before that, not on every
        token; default 0 (every update may be sent at once)."""
        return 0.0

    @property
    @abc.abstractmethod
    def thread_id(self) -> str:
        """Platform id of the thread the answer lives in."""

    def posted_ids(self) -> Sequence[str]:
        """Platform ids of the messages this answer has posted so far (its placeholder): a thread
        read back for this answer leaves them out. Default: none known."""
        return ()

    def abandon(self) -> None:
        """The answer was given up (the watchdog, :mod:`bot.progress`): stop any background work
        (edits, a call in flight). Default: nothing runs in the background."""
        return None


class ChatAdapter(abc.ABC):
    """A chat platform connection (Slack, Mattermost, terminal)."""

    platform: str = "abstract"
    access: AccessPolicy | None = None
    """Who may ask on this platform (``None``: everyone, as in the terminal)."""

    @abc.abstractmethod
    async def start(self, submit: MessageSink) -> None:
        """Connect and begin handing accepted messages to ``submit``; returns once listening."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop taking new messages; answers in flight may still post until :meth:`close`."""

    async def close(self) -> None:
        """Release the platform connections (after the pipeline drained); default: nothing to do."""
        return None

    async def preflight(self) -> None:
        """Check the credentials with the platform before the model loads (minutes, on a GPU):
        :class:`~bot.errors.StartupError` naming the setting and the fix when they are refused.
        Default: nothing to check."""
        return None

    async def acknowledge(self, message: IncomingMessage) -> None:
        """Show a sign of life for ``message`` at once (no channel post); never raises."""
        return None

    async def conclude(self, message: IncomingMessage, *, ok: bool) -> None:
        """Replace the sign of life with a done (``ok``) or failed mark (in the background, as the
        rate budget allows); returns at once, never raises."""
        return None

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

    async def channel_name(self, channel: str) -> str | None:
        """The name of ``channel`` (for channel scopes that match names); ``None``: unknown."""
        return None

    async def read_thread(
        self, channel: str, thread_id: str, *, limit: int, page_size: int = 200
    ) -> ThreadRead | None:
        """The thread's messages as the platform has them (at most ``limit``, the newest kept; read
        ``page_size`` a call), oldest first; ``None``: this platform keeps no threads to read (the
        terminal). Raises a :mod:`bot.errors` ``PlatformError`` branch when the platform refuses."""
        return None

    async def thread_from_link(self, text: str, channel: str) -> str | None:
        """The thread a link in ``text`` points at, when it is a link to a message of ``channel``
        on this platform (``/rca summary <link>``); ``None`` otherwise."""
        return None

    async def upload_file(
        self, channel: str, thread_id: str, *, filename: str, content: bytes, title: str, comment: str
    ) -> str:
        """Share a file in a thread with a short comment; returns the file's id. Raises a
        :mod:`bot.errors` ``PlatformError`` branch when the platform refuses."""
        raise NotImplementedError(f"{self.platform} cannot upload files")
