"""What every chat platform shares when streaming an answer: splitting, pacing, throttled edits.

Platforms differ in their API calls and markup, not in the shape of a streamed reply: post a
placeholder at once (or, once a sign of life was shown, the first text), edit it as text arrives
(at most once per ``edit_interval_s`` per message and within the app-wide rate budget, the newest
text wins), then split the final text at paragraph or code-block boundaries and edit / post the
pieces, the last one carrying the footer. Subclasses supply ``_post`` and ``_edit``.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bot.adapters.base import ReplyStream, cancel_pending
from bot.adapters.ratelimit import Priority, RateBudget, Ticket, prepaid, release_when_done, ticket
from bot.event_loop import stop_task
from bot.retry import until_deadline
from bot.types import FinalAnswer

logger = logging.getLogger(__name__)

_FENCE = re.compile(r"^\s*```")
STREAMING_CURSOR = " ▍"
"""Appended to partial text while the answer is still streaming."""


@dataclass(frozen=True)
class Piece:
    """One message of a split text: ``text == opener + original[start:end] + closer``.

    ``opener`` and ``closer`` are the fence lines added where a code block was cut (``"```bash\\n"``
    and ``"\\n```"``), empty otherwise; what lies between two pieces' slices is whitespace only.
    """

    text: str
    start: int
    end: int
    opener: str = ""
    closer: str = ""


@dataclass(frozen=True)
class _Block:
    start: int
    end: int
    fence: str | None  # the opening fence line of a code block; None for a paragraph
    closed: bool = True  # a code block's closing fence is in the text


def split_text(text: str, limit: int) -> list[str]:
    """Split ``text`` into pieces of at most ``limit`` characters (see :func:`split_pieces`)."""
    return [piece.text for piece in split_pieces(text, limit)]


def split_pieces(text: str, limit: int) -> list[Piece]:
    """Split ``text`` into pieces of at most ``limit`` characters, each a slice of the text.

    Cuts fall between paragraphs where possible; a fenced code block stays whole unless it alone
    exceeds the limit, in which case it is cut between lines and every piece is re-fenced (the
    opening fence line repeated, a closing one added) so each message still renders as code.
    Lines longer than the limit are cut hard as a last resort. Nothing is lost or reordered: the
    slices, in order, are the text minus the whitespace at the cuts (see :class:`Piece`).
    """
    if limit < 16:
        raise ValueError("limit must be at least 16 characters")
    if len(text) <= limit:
        return [Piece(text, 0, len(text))]
    pieces: list[Piece] = []
    current: tuple[int, int] | None = None  # the slice being filled
    for block in _blocks(text):
        if current is not None and block.end - current[0] <= limit:
            current = (current[0], block.end)
            continue
        if current is not None:
            pieces.append(Piece(text[current[0] : current[1]], *current))
            current = None
        if block.end - block.start <= limit:
            current = (block.start, block.end)
            continue
        parts = _cut_block(text, block, limit)
        pieces.extend(parts[:-1])
        last = parts[-1]
        if last.opener or last.closer:
            pieces.append(last)
        else:  # a plain slice: later blocks may still join it
            current = (last.start, last.end)
    if current is not None:
        pieces.append(Piece(text[current[0] : current[1]], *current))
    return pieces


def _lines(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """(start, end) of each line of ``text[start:end]``, newlines excluded."""
    spans = []
    at = start
    while at <= end:
        newline = text.find("\n", at, end)
        stop = end if newline < 0 else newline
        spans.append((at, stop))
        if newline < 0:
            break
        at = newline + 1
    return spans


def _blocks(text: str) -> list[_Block]:
    """Paragraphs and whole fenced code blocks, as spans of ``text``, in order."""
    blocks: list[_Block] = []
    para: tuple[int, int] | None = None
    code: tuple[int, str] | None = None  # (start, fence line)
    for start, end in _lines(text, 0, len(text)):
        line = text[start:end]
        if code is not None:
            if _FENCE.match(line):
                blocks.append(_Block(code[0], end, code[1]))
                code = None
            continue
        if _FENCE.match(line):
            if para is not None:
                blocks.append(_Block(*para, None))
                para = None
            code = (start, line)
        elif line.strip() == "":
            if para is not None:
                blocks.append(_Block(*para, None))
                para = None
        else:
            para = (para[0] if para else start, end)
    if code is not None:  # unterminated fence: code to the end of the text
        blocks.append(_Block(code[0], len(text), code[1], closed=False))
    if para is not None:
        blocks.append(_Block(*para, None))
    return blocks


def _cut_block(text: str, block: _Block, limit: int) -> list[Piece]:
    """A block longer than ``limit`` as several pieces (code re-fenced at every cut)."""
    lines = _lines(text, block.start, block.end)
    plain = [Piece(text[a:b], a, b) for a, b in _pack(text, lines, limit)]
    if block.fence is None:
        return plain
    fence, body = lines[0], lines[1:]
    closing = body.pop() if block.closed else None
    opener, closer = text[fence[0] : fence[1]] + "\n", "\n```"
    room = limit - len(opener) - len(closer)
    # No room to repeat the fence line (or only fence lines): cut as text, fences as they fall.
    if room < 8 or not body or (closing is not None and len(opener) + closing[1] - closing[0] > limit):
        return plain
    spans: list[list[Any]] = []  # [start, end, added opener, added closer]
    for index, (a, b) in enumerate(_pack(text, body, room)):
        # the first piece starts with the text's own fence line, later ones repeat it
        spans.append([fence[0], b, "", closer] if index == 0 else [a, b, opener, closer])
    last = spans[-1]
    if closing is None:
        last[3] = ""  # unterminated in the text: left open, as written
    elif len(last[2]) + closing[1] - last[0] <= limit:
        last[1], last[3] = closing[1], ""  # the text's own closing fence ends the last piece
    else:  # no room for it: the closing fence line goes alone, re-opened (an empty code block)
        spans.append([closing[0], closing[1], opener, ""])
    return [Piece(head + text[a:b] + tail, a, b, head, tail) for a, b, head, tail in spans]


def _pack(text: str, lines: list[tuple[int, int]], limit: int) -> list[tuple[int, int]]:
    """Line spans packed greedily into slices of at most ``limit`` characters (an overlong line
    is cut hard); the newline at a cut is left out."""
    out: list[tuple[int, int]] = []
    current: tuple[int, int] | None = None
    for a, b in lines:
        if current is not None and b - current[0] <= limit:
            current = (current[0], b)
            continue
        if current is not None:
            if text[current[0] : current[1]].strip():
                out.append(current)
            else:  # blank lines before an overlong one: carried into its first cut, never alone
                a = current[0]
            current = None
        while b - a > limit:
            out.append((a, a + limit))
            a += limit
        current = (a, b)
    if current is not None and (text[current[0] : current[1]].strip() or not out):
        out.append(current)
    return out


class StreamingReply(ReplyStream):
    """A streamed answer as a message that is edited, then split into final messages.

    Edits run in a background task so the engine's stream is never slowed by chat API latency.
    Each edit waits at least ``edit_interval_s`` after the previous one on this message, then for
    a slot of the app-wide ``budget`` (streaming priority, oldest stream first), and only then
    takes the newest text, so an edit that waited long still shows the latest words. Intermediate
    edits that fail are logged and skipped (the final edit repairs them); a final edit or post
    that fails raises the adapter's :class:`~bot.errors.PlatformError`.

    ``post_placeholder=False`` (a sign of life was already shown elsewhere): nothing is posted
    until there is text, and an answer that is complete before then is posted once, final; while
    the app's edit budget is spent, the first post waits for the end too, so the answer costs one
    post instead of a post and an edit.
    """

    edit_method = "edit"
    """Budget name of an edit (``chat.update``, ``PUT /posts/{id}/patch``)."""
    post_method = "post"
    """Budget name of a new message (``chat.postMessage``, ``POST /posts``): per channel too."""

    def __init__(
        self,
        *,
        channel: str,
        thread_id: str,
        limit: int,
        edit_interval_s: float = 1.0,
        budget: RateBudget | None = None,
        placeholder: str = "_thinking…_",
        post_placeholder: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.channel = channel
        self._thread_id = thread_id
        self.limit = limit
        self.edit_interval_s = edit_interval_s
        self.budget = budget
        self.placeholder = placeholder
        self.post_placeholder = post_placeholder
        self.clock = clock
        self.message_ids: list[str] = []
        """Ids of the messages posted so far (placeholder first)."""
        self._latest: str | None = None
        self._shown: str | None = None
        self._last_edit = float("-inf")
        self._started_at = clock()
        self._editor: asyncio.Task[None] | None = None
        self._in_flight: asyncio.Future[Any] | None = None
        self._wake = asyncio.Event()
        self._closed = False
        self._reserved = False

    def posted_ids(self) -> Sequence[str]:
        """The placeholder and any split-off messages posted so far."""
        return tuple(self.message_ids)

    @property
    def thread_id(self) -> str:
        return self._thread_id

    # -- what a platform implements -------------------------------------------------------
    @abc.abstractmethod
    async def _post(self, text: str, final: FinalAnswer | None) -> str:
        """Post a new message in the thread; return its id. ``final``: render the footer."""

    @abc.abstractmethod
    async def _edit(self, message_id: str, text: str, final: FinalAnswer | None) -> None:
        """Replace a message's text. ``final``: this is its last edit; render the footer."""

    def _format(self, text: str) -> str:
        """Platform markup for model Markdown (identity by default)."""
        return text

    def _final_limit(self, answer: FinalAnswer) -> int:
        """Characters of answer text that fit in a message next to the footer."""
        return self.limit

    # -- the shared flow --------------------------------------------------------------------
    async def start(self) -> None:
        """Post the placeholder (paced per channel), unless it is deferred to the first text."""
        if not self.post_placeholder:
            return
        with ticket(Priority.ACK):
            message_id = await self._post(self.placeholder, None)
        self.message_ids.append(message_id)
        # The edit interval paces the answer's text: the first words replace the placeholder as
        # soon as they exist (the app-wide edit budget still holds), later edits wait their turn.

    def seconds_to_next_edit(self) -> float:
        return max(0.0, self._last_edit + self.edit_interval_s - self.clock())

    async def update(self, text: str) -> None:
        if self._closed or (self.post_placeholder and not self.message_ids):
            return
        self._latest = text
        self._wake.set()
        if self._editor is None:
            self._editor = asyncio.create_task(self._edit_loop(), name=f"reply-edits-{self.channel}")

    async def _edit_loop(self) -> None:
        while not self._closed:
            await self._wake.wait()
            self._wake.clear()
            wait = self._last_edit + self.edit_interval_s - self.clock()
            if wait > 0:
                await asyncio.sleep(wait)
            if self._latest is None or self._latest == self._shown or self._closed:
                continue
            if not self._latest.strip():  # whitespace shows nothing and would spend the interval
                continue
            posting = not self.message_ids
            if posting and self.budget is not None:
                if self.budget.spare(self.edit_method) < 1:
                    # The app's edit budget is spoken for: partial text posted now needs an edit
                    # later that other answers are waiting for. The sign of life already shows the
                    # answer is coming; it is posted once, complete, by finish() (or when edits free up).
                    continue
                self.budget.reserve(self.edit_method)  # this answer's final edit
                self._reserved = True
            method = self.post_method if posting else self.edit_method
            # The stream that waited longest since its last edit goes first among streams.
            since = self._started_at if self._last_edit == float("-inf") else self._last_edit
            permit = None
            if self.budget is not None:
                permit = await self.budget.acquire(
                    method, self.channel, ticket=Ticket(Priority.STREAM, since)
                )
            text = self._latest  # the newest text, taken after the wait for a slot
            shown = self._format(text)
            if len(shown) + len(STREAMING_CURSOR) > self.limit:
                shown = shown[: self.limit - len(STREAMING_CURSOR) - 1] + "…"
            # The next edit waits a full interval after this one *completed*: the platform saw this
            # one no later than that, so it never sees two closer than the interval. The call runs
            # as its own task so that finish() can stop this loop without cutting a request in half.
            with prepaid(permit):
                if posting:
                    self._in_flight = asyncio.ensure_future(self._post_first(shown + STREAMING_CURSOR))
                else:
                    self._in_flight = asyncio.ensure_future(
                        self._edit(self.message_ids[0], shown + STREAMING_CURSOR, None)
                    )
            if permit is not None:  # the transport releases it when the call completes; else here
                self._in_flight.add_done_callback(release_when_done(permit))
            try:
                await asyncio.shield(self._in_flight)
                self._shown = text
                if self.first_visible_at is None:
                    self.first_visible_at = time.perf_counter()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # an intermediate edit may fail; the final one repairs it
                logger.warning("streaming edit failed in %s: %s", self.channel, exc)
            finally:
                # Also when finish() cancels this loop: then the edit is done (this time is late
                # enough) or still running (finish() waits for it and takes the time again).
                self._last_edit = self.clock()

    async def _post_first(self, text: str) -> None:
        self.message_ids.append(await self._post(text, None))

    async def finish(self, answer: FinalAnswer) -> None:
        self._closed = True
        if self._reserved and self.budget is not None:
            self.budget.unreserve(self.edit_method)  # the final edit is made below
            self._reserved = False
        await stop_task(self._editor)
        if self._in_flight is not None and not self._in_flight.done():
            with contextlib.suppress(Exception):  # its outcome no longer matters, its timing does
                await self._in_flight
            self._last_edit = self.clock()
        chunks = split_text(self._format(answer.text) or "_(empty answer)_", self._final_limit(answer))
        last = len(chunks) - 1
        # The final text is the answer: its calls go first and retry until their deadline.
        with ticket(Priority.FINAL), until_deadline():
            if self.message_ids:
                wait = self._last_edit + self.edit_interval_s - self.clock()
                if wait > 0:  # the final edit respects the per-message edit rate too
                    await asyncio.sleep(wait)
                await self._edit(self.message_ids[0], chunks[0], answer if last == 0 else None)
            else:  # nothing shown yet: the first message is posted complete
                self.message_ids.append(await self._post(chunks[0], answer if last == 0 else None))
            if self.first_visible_at is None:
                self.first_visible_at = time.perf_counter()
            for i, chunk in enumerate(chunks[1:], start=1):
                self.message_ids.append(await self._post(chunk, answer if i == last else None))

    def abandon(self) -> None:
        """Stop the edits and a call in flight of an answer given up (the watchdog): their permits
        are released as they end."""
        self._closed = True
        cancel_pending(self._editor, self._in_flight)


FOOTER_REASON_CHARS = 160
"""A failed source's reason in a footer is cut to this many characters (the full text is logged)."""


def failure_reason(detail: str) -> str:
    """A failed source's note as one short line: the upstream error without the queries that were
    sent (a failed Prometheus lists every PromQL query it tried: twenty lines in a footer)."""
    reason = " ".join(detail.split(" (query: ", 1)[0].split())
    if len(reason) > FOOTER_REASON_CHARS:
        reason = reason[: FOOTER_REASON_CHARS - 1].rstrip() + "…"
    return reason


def format_footer_line(answer: FinalAnswer) -> str:
    """Plain-text footer: sources (ok / failed / left out), the cluster scope, runbook links and
    timings with units."""
    parts: list[str] = []
    used = [s.name for s in answer.sources if s.status == "ok"]
    failed = [
        f"{s.name} ({s.status}{': ' + failure_reason(s.detail) if s.detail else ''})"
        for s in answer.sources
        if s.status not in ("ok", "skipped", "empty")
    ]
    empty = [s.name for s in answer.sources if s.status == "empty"]
    parts.append("sources: " + (", ".join(used) if used else "none"))
    if empty:
        parts.append("nothing found in: " + ", ".join(empty))
    if failed:
        parts.append("failed: " + "; ".join(failed))
    if answer.left_out:
        parts.append("left out: " + ", ".join(answer.left_out))
    if answer.scope:
        parts.append("scope: " + answer.scope)
    links = [link for s in answer.sources for link in s.links]
    if links:
        parts.append(("runbook: " if len(links) == 1 else "runbooks: ") + ", ".join(links))
    timing: list[str] = []
    if answer.ttft_ms is not None:
        timing.append(f"first token {answer.ttft_ms / 1000:.2f} s")
    if answer.total_ms is not None:
        timing.append(f"total {answer.total_ms / 1000:.2f} s")
    if answer.output_tokens is not None:
        timing.append(f"{answer.output_tokens} tokens")
    if timing:
        parts.append(", ".join(timing))
    return " · ".join(parts)
