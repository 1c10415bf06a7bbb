"""An answer in a Slack thread: :class:`SlackReply` with its two renderings, chosen at run time.

Slack's native streaming (``chat.startStream`` / ``appendStream`` / ``stopStream`` through
slack_sdk's ``AsyncChatStream``: context gathering shown as plan / task updates, then the answer as
markdown) or post-and-edit (``chat.postMessage`` + ``chat.update`` in mrkdwn). Both see the
adapter only through :class:`ReplyHost`, the few things a reply needs of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from slack_sdk.errors import SlackRequestError
from slack_sdk.web.async_chat_stream import AsyncChatStream

from bot.adapters.base import ReplyStream, cancel_pending
from bot.adapters.ratelimit import (
    BudgetTimeout,
    Priority,
    RateBudget,
    Ticket,
    prepaid,
    release_when_done,
    ticket,
)
from bot.adapters.slack_api import SlackCallError, SlackWebClient
from bot.adapters.slack_format import (
    answer_blocks,
    fallback_text,
    footer_blocks,
    markdown_to_mrkdwn,
)
from bot.adapters.streaming import StreamingReply, split_text
from bot.config import SlackSettings
from bot.event_loop import stop_task
from bot.retry import (
    until_deadline,
)
from bot.types import FinalAnswer, IncomingMessage, SourceNote, StepUpdate

logger = logging.getLogger(__name__)

NATIVE_TEXT_LIMIT = 12_000
"""Characters of markdown in one natively streamed message (``markdown_text``'s limit)."""
FIRST_PIECE_CHARS = 4
"""Text is streamed up to its last whole word (a word still growing may yet turn out to be a secret
and be redacted), except the answer's very first piece: until a first word is whole, up to this
many of its characters go out at once. The engine sends the first token alone and the next ones a
few tokens later (vLLM's ``stream_interval``), so waiting for the first whole word cost one or two
such intervals (90-180 ms under load on the H200) before anything was visible. Four characters
of a word that does turn out to be a secret are at most its public type prefix (``ghp_``,
``AKIA``, ``xoxb``, ``sk-p``, ``eyJh``), and the final message replaces it."""
SOURCES_WAIT_S = 0.5
"""Seconds the sources' task update waits for the answer's first words to share its
``chat.appendStream`` (one call instead of two per answer, and no round trip ahead of the first
words); sent alone after that, so a long model queue never hides which sources were read."""
STREAM_UNAVAILABLE = frozenset(
    {
        "unknown_method",
        "not_allowed_token_type",
        "missing_scope",
        "method_deprecated",
        "deprecated_endpoint",
        "access_denied",
        "not_allowed",
        "enterprise_is_restricted",
        "is_bot",
    }
)
"""``chat.startStream`` errors that mean this workspace (app, token) cannot stream natively at all:
remembered per workspace. Any other refusal (a channel type, a recipient) falls back for one answer."""
SIGN_OF_LIFE_KEY = "slack_sign_of_life"
"""``IncomingMessage.extra`` key: which sign of life the adapter showed (``reaction``, ``status``,
``ephemeral``); an answer whose asker saw one posts its first message with its first text."""
_DEFANG = re.compile(r"<([!@#])")


class ReplyHost(Protocol):
    """What a reply needs of the Slack adapter (:class:`bot.adapters.slack.SlackAdapter`)."""

    settings: SlackSettings
    budget: RateBudget
    client: SlackWebClient
    team_id: str | None

    async def call(
        self,
        method: str,
        params: Mapping[str, Any],
        *,
        channel: str | None = None,
        token: str | None = None,
        http_verb: str = "POST",
    ) -> dict[str, Any]:
        """One Web API call through the transport."""

    def post_tag(self, request_id: str) -> dict[str, Any]:
        """Message metadata for one new post."""

    async def post_piece(
        self, channel: str, thread_ts: str | None, mrkdwn: str, final: FinalAnswer | None, request_id: str
    ) -> str:
        """Post one message of an answer; its ``ts``."""

    def may_stream_natively(self, message: IncomingMessage) -> bool:
        """Whether ``message``'s answer may try ``chat.startStream``."""

    def streaming_refused(self, message: IncomingMessage, exc: SlackCallError) -> None:
        """Slack refused ``chat.startStream`` for ``message``."""


def _defang(markdown: str) -> str:
    """Break Slack's ``<!channel>`` / ``<@U…>`` / ``<#C…>`` sequences in model text (it may quote
    untrusted context); a zero-width space keeps the text readable and prefixes stable."""
    return _DEFANG.sub("<\u200b\\1", markdown)


class _EditRendering(StreamingReply):
    """Post-and-edit: ``chat.postMessage`` (placeholder or first text), ``chat.update`` edits."""

    edit_method = "chat.update"
    post_method = "chat.postMessage"

    def __init__(self, adapter: ReplyHost, message: IncomingMessage, thread_ts: str) -> None:
        settings = adapter.settings
        super().__init__(
            channel=message.channel,
            thread_id=thread_ts,
            limit=settings.message_limit,
            edit_interval_s=settings.edit_interval_s,
            budget=adapter.budget,
            post_placeholder=settings.post_placeholder == "always" or not message.extra.get(SIGN_OF_LIFE_KEY),
        )
        self._adapter = adapter
        self._request_id = message.request_id

    def _format(self, text: str) -> str:
        return markdown_to_mrkdwn(text)

    async def _post(self, text: str, final: FinalAnswer | None) -> str:
        return await self._adapter.post_piece(self.channel, self.thread_id, text, final, self._request_id)

    async def _edit(self, message_id: str, text: str, final: FinalAnswer | None) -> None:
        params: dict[str, Any] = {"channel": self.channel, "ts": message_id, "text": fallback_text(text)}
        if final is not None:
            params["blocks"] = answer_blocks(text, final)
        await self._adapter.call("chat.update", params, channel=self.channel)


class _NativeRendering(ReplyStream):
    """Slack's native streaming through slack_sdk's ``AsyncChatStream``: a plan while context is
    gathered, task updates per source, then the answer appended as markdown within the
    ``chat.appendStream`` budget, and ``chat.stopStream`` with the footer and feedback buttons."""

    def __init__(self, adapter: ReplyHost, message: IncomingMessage, thread_ts: str) -> None:
        self._adapter = adapter
        self._message = message
        self._thread_ts = thread_ts
        self.channel = message.channel
        self.limit = min(adapter.settings.message_limit, NATIVE_TEXT_LIMIT)
        self.edit_interval_s = adapter.settings.edit_interval_s
        self.stream = AsyncChatStream(
            adapter.client,
            channel=message.channel,
            logger=logging.getLogger("bot.adapters.slack.stream"),
            thread_ts=thread_ts,
            buffer_size=1,  # every append is sent; the budget and the edit interval decide when
            recipient_team_id=message.team or adapter.team_id,
            recipient_user_id=message.user,
            task_display_mode="plan",
        )
        self._sent = ""
        self._latest: str | None = None
        self._broken: str | None = None
        self._editor: asyncio.Task[None] | None = None
        self._in_flight: asyncio.Future[Any] | None = None
        self._wake = asyncio.Event()
        self._closed = False
        self._started_at = time.monotonic()
        self._last_append = float("-inf")
        self._pending_chunks: list[dict[str, Any]] | None = None
        """The sources' task updates, waiting for the first words to travel with (``show_sources``)."""
        self._sources_due = float("inf")

    @property
    def thread_id(self) -> str:
        return self._thread_ts

    @property
    def ts(self) -> str | None:
        """The streamed message's ``ts`` (after :meth:`start`)."""
        return self.stream.ts

    def posted_ids(self) -> Sequence[str]:
        """The streamed message, once started."""
        return (self.stream.ts,) if self.stream.ts else ()

    async def start(self) -> None:
        """``chat.startStream`` with the plan (the caller holds the ``startStream`` slot)."""
        with ticket(Priority.ACK):
            await self.stream.append(
                chunks=[
                    {"type": "plan_update", "title": "Looking into it"},
                    {
                        "type": "task_update",
                        "id": "context",
                        "title": "Cluster context",
                        "status": "in_progress",
                    },
                ]
            )

    async def show_sources(self, sources: Sequence[SourceNote]) -> None:
        """Queue the sources' task updates: they travel with the answer's first words (one
        ``chat.appendStream``, no round trip ahead of them) or alone after ``SOURCES_WAIT_S``."""
        chunks: list[dict[str, Any]] = []
        for i, note in enumerate(sources):
            failed = note.status not in ("ok", "empty", "skipped")
            chunk: dict[str, Any] = {
                "type": "task_update",
                "id": f"source-{i}",
                "title": note.name,
                "status": "error" if failed else "complete",
            }
            if failed or note.status == "empty":
                chunk["output"] = f"{note.status}{': ' + note.detail if note.detail else ''}"[:200]
            chunks.append(chunk)
        chunks.append(
            {"type": "task_update", "id": "context", "title": "Cluster context", "status": "complete"}
        )
        if self._closed or self._broken:
            return
        self._pending_chunks = [*(self._pending_chunks or []), *chunks]  # after any step updates
        self._sources_due = min(self._sources_due, time.monotonic() + SOURCES_WAIT_S)
        asyncio.get_running_loop().call_later(SOURCES_WAIT_S, self._wake.set)
        self._start_editor()

    steps_in_text = False
    """Investigation steps are task updates of the stream's plan, not answer text."""

    async def show_step(self, step: StepUpdate, checklist: str) -> None:
        """A task update per step (pending -> in_progress, then complete / error with its one-line
        result and source), sent alone at once, paced by the ``chat.appendStream`` budget."""
        if self._closed or self._broken:
            return
        chunk: dict[str, Any] = {
            "type": "task_update",
            "id": f"step-{step.index}",
            "title": f"[{step.index}] {step.title}"[:200],
            "status": {"pending": "in_progress", "done": "complete"}.get(step.state, "error"),
        }
        if step.state != "pending" and (step.detail or step.source):
            chunk["output"] = " — ".join(p for p in (step.detail, step.source) if p)[:200]
        self._pending_chunks = [*(self._pending_chunks or []), chunk]
        self._sources_due = time.monotonic()  # due now: a step is news, not text to batch
        self._wake.set()
        self._start_editor()

    def seconds_to_next_edit(self) -> float:
        return max(0.0, self._last_append + self.edit_interval_s - time.monotonic())

    async def update(self, text: str) -> None:
        if self._closed or self._broken:
            return
        self._latest = text
        self._wake.set()
        self._start_editor()

    def _start_editor(self) -> None:
        if self._editor is None:
            self._editor = asyncio.create_task(self._append_loop(), name=f"reply-stream-{self.channel}")

    def _stable_delta(self) -> str:
        """New text to append: only what extends what was sent, up to the last whole word (a word
        still growing may yet be redacted), within the message limit."""
        if self._latest is None:
            return ""
        # Leading whitespace shows nothing, and engines differ on whether the final text keeps it:
        # streamed and final text both start at the first visible character, so they still match.
        shown = _defang(self._latest).lstrip()
        if not shown.startswith(self._sent):
            return ""  # rewritten (redaction): the final message repairs it
        cut = max(shown.rfind(" "), shown.rfind("\n")) + 1
        stable = shown[: min(cut, self.limit)]
        if not self._sent and not stable.strip():
            stable = shown[:FIRST_PIECE_CHARS]  # the first characters at once (see FIRST_PIECE_CHARS)
        delta = stable[len(self._sent) :]
        # Whitespace alone shows nothing yet and would spend the edit interval: wait for a word.
        return delta if delta.strip() else ""

    def _sources_overdue(self) -> bool:
        return self._pending_chunks is not None and time.monotonic() >= self._sources_due

    async def _append_loop(self) -> None:
        budget = self._adapter.budget
        while not self._closed:
            await self._wake.wait()
            self._wake.clear()
            wait = self._last_append + self.edit_interval_s - time.monotonic()
            text_due = True
            if wait > 0:
                if self._sources_overdue():  # the edit interval paces text, not the task update
                    text_due = False
                else:
                    await asyncio.sleep(wait)
            if self._closed or not (self._stable_delta() or self._sources_overdue()):
                continue
            since = self._started_at if self._last_append == float("-inf") else self._last_append
            permit = await budget.acquire(
                "chat.appendStream", self.channel, ticket=Ticket(Priority.STREAM, since)
            )
            delta = self._stable_delta() if text_due else ""  # the newest, after the wait for a slot
            chunks = self._take_pending()
            if not delta and not chunks:
                permit.release()
                continue
            with prepaid(permit):
                self._in_flight = asyncio.ensure_future(self._append(delta, chunks))
            self._in_flight.add_done_callback(release_when_done(permit))
            try:
                await asyncio.shield(self._in_flight)
            except asyncio.CancelledError:
                raise
            except (SlackCallError, SlackRequestError) as exc:
                if not delta:  # the task update alone: the footer still lists the sources
                    logger.warning("slack stream task update failed in %s: %s", self.channel, exc)
                    continue
                self._broken = str(exc)
                logger.warning(
                    "slack stream append failed in %s: %s (repaired at the end)", self.channel, exc
                )
                return
            finally:
                if delta:
                    self._last_append = time.monotonic()
                elif self._latest is not None:
                    self._wake.set()  # text held back by its edit interval goes next

    async def _append(self, delta: str, chunks: list[dict[str, Any]] | None = None) -> None:
        # What was sent is recorded here, not in the loop: finish() may stop the loop mid-call.
        if chunks:
            text = [{"type": "markdown_text", "text": delta}] if delta else []
            await self.stream.append(chunks=[*chunks, *text])
        else:
            await self.stream.append(markdown_text=delta)
        self._sent += delta
        if delta and self.first_visible_at is None:
            self.first_visible_at = time.perf_counter()

    def abandon(self) -> None:
        self._closed = True
        cancel_pending(self._editor, self._in_flight)

    async def finish(self, answer: FinalAnswer) -> None:
        self._closed = True
        await stop_task(self._editor)
        if self._in_flight is not None and not self._in_flight.done():
            with contextlib.suppress(Exception):
                await self._in_flight
            self._last_append = time.monotonic()
            if self._in_flight.exception() is not None:
                self._broken = str(self._in_flight.exception())
        chunks = split_text(_defang(answer.text).lstrip() or "_(empty answer)_", self.limit)
        single = len(chunks) == 1
        tag = self._adapter.post_tag(answer.request_id)
        first = chunks[0]
        streamed = self._broken is None and first.startswith(self._sent)
        # The final text is the answer: its calls go first and retry until their deadline.
        with ticket(Priority.FINAL), until_deadline():
            wait = self._last_append + self.edit_interval_s - time.monotonic()
            if streamed and wait > 0:  # the last piece respects the message's edit rate too
                await asyncio.sleep(wait)
            if streamed:
                try:
                    await self.stream.stop(
                        markdown_text=first[len(self._sent) :] or None,
                        chunks=self._take_pending(),
                        blocks=footer_blocks(answer) if single else None,
                        metadata=tag,
                    )
                except (SlackCallError, SlackRequestError) as exc:
                    streamed = False
                    logger.warning(
                        "slack stream stop failed in %s: %s; replacing the text", self.channel, exc
                    )
            if not streamed:
                await self._repair(first, answer if single else None)
            if self.first_visible_at is None:
                self.first_visible_at = time.perf_counter()
            for i, chunk in enumerate(chunks[1:], start=1):
                await self._adapter.post_piece(
                    self.channel,
                    self._thread_ts,
                    markdown_to_mrkdwn(chunk),
                    answer if i == len(chunks) - 1 else None,
                    answer.request_id,
                )

    def _take_pending(self) -> list[dict[str, Any]] | None:
        """The sources' task updates not sent yet (the stream's last call carries them)."""
        chunks, self._pending_chunks = self._pending_chunks, None
        self._sources_due = float("inf")  # the next queued update sets its own due time
        return chunks

    async def _repair(self, first: str, final: FinalAnswer | None) -> None:
        """The stream no longer matches the answer (redaction rewrote text, a call failed): stop it
        if it still streams, then replace its text with a normal ``chat.update``."""
        if self.stream._state != "completed":  # slack_sdk keeps no public flag for it
            with contextlib.suppress(SlackCallError, SlackRequestError):
                await self.stream.stop(chunks=self._take_pending())
        mrkdwn = markdown_to_mrkdwn(first)
        params: dict[str, Any] = {
            "channel": self.channel,
            "ts": self.stream.ts,
            "text": fallback_text(mrkdwn),
            "blocks": answer_blocks(mrkdwn, final),
        }
        await self._adapter.call("chat.update", params, channel=self.channel)


class SlackReply(ReplyStream):
    """One answer in a Slack thread, rendered natively or as post-and-edit (chosen in :meth:`start`)."""

    def __init__(self, adapter: ReplyHost, message: IncomingMessage, thread_ts: str) -> None:
        self._adapter = adapter
        self._message = message
        self._thread_ts = thread_ts
        self._rendering: ReplyStream | None = None
        self.rendering = ""
        """``native`` or ``edit`` once started."""

    @property
    def thread_id(self) -> str:
        return self._thread_ts

    async def start(self) -> None:
        """Native streaming where this workspace, this message and the ``startStream`` budget allow
        it; post-and-edit otherwise (or when Slack refuses the stream)."""
        adapter, message = self._adapter, self._message
        if adapter.may_stream_natively(message):
            wait = None if adapter.settings.streaming == "native" else adapter.settings.native_start_wait_s
            try:
                permit = await adapter.budget.acquire(
                    "chat.startStream", message.channel, ticket=Ticket(Priority.ACK), max_wait_s=wait
                )
            except BudgetTimeout:
                logger.info("slack: no chat.startStream slot within %.1f s: post-and-edit", wait or 0.0)
            else:
                native = _NativeRendering(adapter, message, self._thread_ts)
                try:
                    with prepaid(permit):
                        await native.start()
                    self._rendering, self.rendering = native, "native"
                    return
                except SlackCallError as exc:
                    adapter.streaming_refused(message, exc)
                finally:
                    permit.release()
        edit = _EditRendering(adapter, message, self._thread_ts)
        await edit.start()
        self._rendering, self.rendering = edit, "edit"

    @property  # type: ignore[override]
    def first_visible_at(self) -> float | None:
        """When answer text first reached Slack (the rendering's own record)."""
        return self._rendering.first_visible_at if self._rendering is not None else None

    @first_visible_at.setter
    def first_visible_at(self, value: float | None) -> None:
        if self._rendering is not None:
            self._rendering.first_visible_at = value

    @property
    def _r(self) -> ReplyStream:
        if self._rendering is None:
            raise RuntimeError("SlackReply.start() was not called")
        return self._rendering

    async def show_sources(self, sources: Sequence[SourceNote]) -> None:
        await self._r.show_sources(sources)

    @property
    def steps_in_text(self) -> bool:  # type: ignore[override]
        """As the rendering chosen at start (native: task updates; edit: the checklist as text)."""
        return self._rendering.steps_in_text if self._rendering is not None else True

    async def show_step(self, step: StepUpdate, checklist: str) -> None:
        await self._r.show_step(step, checklist)

    def seconds_to_next_edit(self) -> float:
        return self._r.seconds_to_next_edit() if self._rendering is not None else 0.0

    async def update(self, text: str) -> None:
        await self._r.update(text)

    async def finish(self, answer: FinalAnswer) -> None:
        await self._r.finish(answer)

    def posted_ids(self) -> Sequence[str]:
        return self._rendering.posted_ids() if self._rendering is not None else ()

    def abandon(self) -> None:
        if self._rendering is not None:
            self._rendering.abandon()
