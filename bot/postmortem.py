"""Postmortem drafts: generated like any answer, delivered as a Markdown file in the thread plus a
short message.

While the draft is written the thread shows progress (:class:`DraftProgress`: characters so far),
not the draft itself. When it is done, :func:`deliver` uploads it as ``postmortem-<date>-<title>.md``
through the adapter (Slack ``files.uploadV2``, a Mattermost file attachment) and returns the short
message the reply ends with. A platform that refuses the upload, or has no files (the terminal),
gets the whole draft inline instead, with the reason: nothing is lost.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from bot.adapters.base import ChatAdapter, ReplyStream
from bot.errors import PlatformError
from bot.types import FinalAnswer

logger = logging.getLogger(__name__)

PROGRESS_TEXT = ":memo: Drafting the postmortem from this thread… {chars:,} characters so far."
_TITLE = re.compile(r"^#\s+(?:postmortem:?\s*)?(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
_SLUG = re.compile(r"[^a-z0-9]+")


class DraftProgress(ReplyStream):
    """A reply that shows how far the draft is instead of the draft (the file carries the text)."""

    def __init__(self, inner: ReplyStream) -> None:
        self.inner = inner

    @property
    def thread_id(self) -> str:
        """The thread of the wrapped reply."""
        return self.inner.thread_id

    def posted_ids(self) -> Sequence[str]:
        """The wrapped reply's messages."""
        return self.inner.posted_ids()

    def seconds_to_next_edit(self) -> float:
        """The wrapped stream's."""
        return self.inner.seconds_to_next_edit()

    async def update(self, text: str) -> None:
        """Show the draft's length so far (the wrapped stream throttles the edits)."""
        await self.inner.update(PROGRESS_TEXT.format(chars=len(text)))

    async def finish(self, answer: FinalAnswer) -> None:
        """Finish the wrapped reply with ``answer`` (the short message, or the draft inline)."""
        await self.inner.finish(answer)
        self.first_visible_at = self.inner.first_visible_at


@dataclass(frozen=True, slots=True)
class Draft:
    """A finished draft as a file."""

    filename: str
    title: str
    content: bytes
    sections: int
    timeline_entries: int


def as_file(text: str, channel_name: str | None, now: datetime | None = None) -> Draft:
    """The draft ``text`` as a Markdown file named after its date and title."""
    now = now or datetime.now(UTC)
    found = _TITLE.search(text)
    title = found.group(1).strip() if found else f"Postmortem draft ({channel_name or 'incident'})"
    slug = _SLUG.sub("-", title.lower()).strip("-")[:60] or "incident"
    sections = len(re.findall(r"^##\s", text, re.MULTILINE))
    timeline = 0
    in_timeline = False
    for line in text.splitlines():
        if line.startswith("## "):
            in_timeline = "timeline" in line.lower()
        elif in_timeline and line.lstrip().startswith(("-", "*", "|")) and re.search(r"\d{1,2}:\d{2}", line):
            timeline += 1
    body = text.rstrip() + "\n"
    return Draft(f"postmortem-{now:%Y-%m-%d}-{slug}.md", title, body.encode("utf-8"), sections, timeline)


async def deliver(
    adapter: ChatAdapter, channel: str, thread_id: str, draft_text: str, channel_name: str | None
) -> str:
    """Upload the draft into the thread; the text the reply ends with (a short message, or the
    draft inline with the reason when the upload could not be made)."""
    draft = as_file(draft_text, channel_name)
    try:
        await adapter.upload_file(
            channel,
            thread_id,
            filename=draft.filename,
            content=draft.content,
            title=draft.title,
            comment=f":page_facing_up: {draft.title}",
        )
    except (PlatformError, NotImplementedError) as exc:
        logger.warning("postmortem upload to %s/%s failed: %s", channel, thread_id, exc)
        note = f"_(The draft could not be attached as a file ({exc}); it is inline above.)_"
        return f"{draft_text.rstrip()}\n\n{note}"
    size_kb = len(draft.content) / 1024
    return (
        f":page_facing_up: Postmortem draft attached: `{draft.filename}` ({size_kb:.1f} KB, "
        f"{draft.sections} sections, {draft.timeline_entries} timeline entries). It is a draft from "
        "this thread and its alerts: check the times, names and root cause before you share it."
    )
