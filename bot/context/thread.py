"""The chat thread as context: what people wrote in it, read back from the platform.

opsbot's own memory of a thread holds only its questions and answers (the stored turns). The
people in an incident thread write much more ("I rolled back payments-api at 14:02"), so when an
answer goes into a thread the pipeline reads the thread from the platform (which also works after
a restart, or on another replica) and this module turns it into context sections:

- the human messages since opsbot's last answer (priority 1: what the question is about),
- the earlier ones (priority 45: kept as the budget allows, the oldest cut first),
- for a catch-up or a postmortem, the whole thread, opsbot's own messages included.

Each message is one line, ``[2026-11-29 14:02 UTC] Dana: ...``, redacted, its line breaks shown
as ``⏎``, long ones cut. Messages of other bots follow the bot policy (``allowed_bots``); the
message being answered and those already in the stored turns are left out (they are in the prompt
already). The sections go after the stored turns in the prompt, so the cached prefix stays the same.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from bot.context.base import ContextSection, ProviderStatus
from bot.redact import redact
from bot.store.records import ThreadMessage
from bot.types import SourceNote, ThreadPost, ThreadRead

SOURCE = "Thread"
SELF_NAME = "opsbot"
_MENTION = re.compile(r"<@[A-Z0-9]+>|@opsbot\b", re.IGNORECASE)
_SPACE = re.compile(r"\s+")


@dataclass(slots=True)
class ThreadContext:
    """The sections made from a thread and the footer note about it."""

    sections: list[ContextSection]
    note: SourceNote
    used: int = 0
    """Messages that went into the sections (before the budget)."""


def _same(text: str) -> str:
    return _SPACE.sub(" ", _MENTION.sub("", text)).strip().lower()


def _line(post: ThreadPost, max_chars: int) -> str:
    text = post.text.strip()
    if len(text) > max_chars:
        text = text[:max_chars] + f" [... {len(post.text) - max_chars} more characters]"
    who = SELF_NAME if post.from_self else (post.user_name or next(iter(post.bot_names), post.user))
    if post.is_bot and not post.from_self:
        who += " (bot)"
    when = post.posted_at.strftime("%Y-%m-%d %H:%M UTC")
    return f"[{when}] {who}: " + redact(text, where="thread").replace("\n", " ⏎ ")


def thread_context(
    read: ThreadRead,
    *,
    answering: str | None,
    stored: Sequence[ThreadMessage] = (),
    whole: bool = False,
    keep_bot: Callable[[ThreadPost], bool] = lambda post: False,
    max_chars: int = 2000,
    exclude: Collection[str] = (),
) -> ThreadContext:
    """Sections of ``read`` for an answer to message ``answering`` (left out: it is the question).

    ``stored``: the thread's stored turns (their questions are not repeated; with none stored, as
    after a restart with a fresh database, opsbot's own earlier answers come from the thread
    instead). ``whole``: the entire thread, for a catch-up or postmortem. ``keep_bot``: the bot
    policy (``True``: that bot's message is kept). ``exclude``: ids of messages to leave out (the
    placeholder of this very answer). opsbot's own messages after ``answering`` are answers still
    being written (this one's placeholder, a concurrent one): left out too.
    """
    asked = {_same(m.content) for m in stored if m.role == "user"}
    own_too = whole or not stored  # opsbot's answers are not in the prompt as stored turns
    kept: list[ThreadPost] = []
    boundary: int | None = None  # index in ``kept`` just after opsbot's last message
    ignored_bots = 0
    asked_at = next((p.posted_at for p in read.posts if p.message_id == answering), None)
    for post in sorted(read.posts, key=lambda p: p.posted_at):
        if post.message_id == answering or post.message_id in exclude or not post.text.strip():
            continue
        if post.from_self and asked_at is not None and post.posted_at >= asked_at:
            continue
        if post.from_self:
            if own_too:
                kept.append(post)
            boundary = len(kept)
            continue
        if post.is_bot and not keep_bot(post):
            ignored_bots += 1
            continue
        if not whole and _same(post.text) in asked:
            continue  # an earlier question to opsbot: already in the stored turns
        kept.append(post)
    since = kept[boundary:] if boundary is not None else kept
    earlier = kept[:boundary] if boundary is not None else []
    sections: list[ContextSection] = []
    if whole:
        if kept:
            sections.append(
                _section("Thread transcript (oldest first)", kept, 1, "earlier thread messages", max_chars)
            )
    else:
        if since:
            if boundary is not None:
                title, unit = (
                    "Messages since opsbot's last answer (oldest first)",
                    "older messages since opsbot's last answer",
                )
            else:
                title, unit = "Messages in this thread (oldest first)", "older thread messages"
            sections.append(_section(title, since, 1, unit, max_chars))
        if earlier:
            sections.append(
                _section("Earlier messages (oldest first)", earlier, 45, "earlier thread messages", max_chars)
            )
    humans = sum(1 for p in kept if not p.from_self)
    parts = [f"{humans} message{'' if humans == 1 else 's'} read" + (" (whole thread)" if whole else "")]
    if not whole and boundary is not None:
        parts.append(f"{sum(1 for p in since if not p.from_self)} since opsbot's last answer")
    if ignored_bots:
        parts.append(f"{ignored_bots} bot message{'' if ignored_bots == 1 else 's'} ignored (bot policy)")
    if read.skipped:
        older = "older messages" if read.skipped < 0 else f"{read.skipped} older messages"
        parts.append(f"{older} not read (thread.max_messages)")
    status = ProviderStatus.OK if sections else ProviderStatus.EMPTY
    return ThreadContext(sections, SourceNote(SOURCE, status.value, "; ".join(parts)), used=len(kept))


def _section(
    title: str, posts: Sequence[ThreadPost], priority: int, unit: str, max_chars: int
) -> ContextSection:
    return ContextSection(
        source=SOURCE,
        title=title,
        body="\n".join(_line(p, max_chars) for p in posts),
        priority=priority,
        unit=unit,
        drop_from="start",
        # What people wrote since the last answer is what they ask about: kept with the decisive
        # facts; older messages only as room allows.
        rank=0 if priority <= 1 else 2,
    )


def thread_failed(error: str) -> SourceNote:
    """The footer note when the thread could not be read (the answer goes on without it)."""
    return SourceNote(SOURCE, ProviderStatus.FAILED.value, redact(error, where="thread"))
