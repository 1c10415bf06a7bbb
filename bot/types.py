"""Platform-neutral message types: the pipeline sees these, never slack_bolt or mattermostdriver."""

from __future__ import annotations

import asyncio
import enum
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def clean_text(text: str) -> str:
    """``text`` with what no store, tokenizer or platform takes replaced by U+FFFD: lone UTF-16
    surrogates (valid as JSON escapes, which Slack and Mattermost events may carry, but not
    encodable as UTF-8) and NUL (PostgreSQL text refuses it)."""
    return _UNSTORABLE.sub("\ufffd", text) if _UNSTORABLE.search(text) else text


class MessageKind(enum.StrEnum):
    """Why opsbot is being asked."""

    MENTION = "mention"
    """@-mention in a channel."""
    DIRECT = "direct"
    """Direct message to the bot."""
    COMMAND = "command"
    """``/rca ...`` slash command."""
    FOLLOWUP = "followup"
    """Human reply in a thread opsbot already answered, without a mention."""
    ALERT = "alert"
    """An Alertmanager notification."""
    BATCH = "batch"
    """One item of a batch analysis (``opsbot analyze``, ``POST /analyze``): nobody waits on it."""


@dataclass(slots=True)
class IncomingMessage:
    """One question for opsbot, normalised by an adapter.

    ``event_id`` is the platform's unique id of the delivery (Slack ``event_id`` / the mention's
    ``channel:ts``, Mattermost post id, ...) used for de-duplication across retries and replicas.
    ``thread_id`` is the thread the answer goes into (``None``: the adapter starts one).
    """

    platform: str
    event_id: str
    channel: str
    user: str
    text: str
    kind: MessageKind
    thread_id: str | None = None
    message_id: str | None = None
    """Platform id of the message itself (Slack ``ts``, Mattermost post id)."""
    posted_at: float | None = None
    """The platform's own time of the message, in seconds since the epoch (Slack's ``ts``,
    Mattermost's ``create_at``): orders it against other posts of its thread on the platform's
    clock (``Store.is_bot_thread``); ``None`` where the event has none (slash commands)."""
    user_name: str | None = None
    team: str | None = None
    channel_name: str | None = None
    """The channel's name where the event carries it (channel scopes may match names)."""
    scenario: str | None = None
    """Force a scenario (``None``: the pipeline picks one from ``kind`` and the text)."""
    is_direct: bool = False
    """Asked in a direct message (DM) rather than a channel (the access policy treats DMs apart)."""
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    """opsbot's id for the answer to this message: set where the event enters, on every log line
    of its handling, in its request row and its footer."""
    received_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    received_perf: float = field(default_factory=time.perf_counter)
    """``time.perf_counter()`` when the adapter took the event: where end-to-end time starts."""
    extra: dict[str, object] = field(default_factory=dict)
    """Adapter-private data (response URLs, trigger ids, ...)."""
    first_word: asyncio.Future[str | None] | None = None
    """Set by an adapter whose slash command's own response can still carry a short text: settled
    with the pipeline's first notice for it (a refusal, help, status: :meth:`settle_first_word`
    from the adapter's ``send_notice``) or with ``None`` once the pipeline takes it on as an answer
    (or drops it as a duplicate). The access check and the command words stay the pipeline's."""

    def settle_first_word(self, text: str | None) -> bool:
        """Settle :attr:`first_word` with ``text`` if it still waits; whether it took it."""
        waiter = self.first_word
        if waiter is None or waiter.done():
            return False
        waiter.set_result(text)
        return True

    async def wait_first_word(self, timeout_s: float) -> str | None:
        """The text settled into :attr:`first_word` within ``timeout_s`` (``None``: none, or no
        answer in time: later notices take the platform's usual way)."""
        waiter = self.first_word
        if waiter is None:
            return None
        try:
            return await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
        except TimeoutError:
            waiter.cancel()  # too late for the command's response: send_notice posts from now on
            return None

    def __post_init__(self) -> None:
        # Ids become store keys and text reaches the tokenizer: both must be encodable.
        for name in ("event_id", "channel", "user", "text", "thread_id", "message_id", "user_name", "team"):
            value = getattr(self, name)
            if isinstance(value, str):
                setattr(self, name, clean_text(value))


@dataclass(slots=True)
class SourceNote:
    """One line of the answer's footer about a context source."""

    name: str
    status: str
    """``ok``, ``failed``, ``timeout``, ``empty`` or ``skipped``."""
    detail: str = ""
    links: list[str] = field(default_factory=list)
    """Documents the footer links (a runbook's URL or file)."""


@dataclass(slots=True)
class FinalAnswer:
    """Everything an adapter needs to render the finished answer and its footer."""

    request_id: str
    text: str
    sources: list[SourceNote] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    """Context that did not fit the token budget, e.g. ``"40 older events"``."""
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    total_ms: float | None = None
    output_tokens: int | None = None
    draws: int = 1
    """How many times the model was asked for this answer: above 1 when an empty answer or one that
    only copied its prompt was asked again (:data:`bot.answer_clean.ASK_AGAIN`)."""
    error: str | None = None
    """Set when the answer is an error message for the user rather than model output."""
    failure: str | None = None
    """Why the model's text was no answer (``bot.answer_clean``'s ``empty``, ``echoed the prompt``);
    ``error`` then says so to the user."""
    feedback: bool = True
    """Whether to offer 👍 / 👎 buttons."""
    scope: str | None = None
    """The cluster(s) and namespaces the answer read (``cluster eu-west, namespaces payments``)."""


@dataclass(frozen=True, slots=True)
class StepUpdate:
    """One investigation step as a reply shows it live (:mod:`bot.investigate`): ``pending`` when
    its tool is called, then ``done`` or ``failed`` with a one-line result and its source."""

    index: int
    state: str
    title: str
    detail: str = ""
    source: str = ""

    def line(self) -> str:
        """``✅ [2] kube_logs namespace=shop pod=api-1 — 40 log lines (Kubernetes default)``."""
        mark = {"pending": "⏳", "done": "✅", "failed": "⚠️"}.get(self.state, "•")
        tail = f" — {self.detail}" if self.detail and self.state != "pending" else ""
        source = f" ({self.source})" if self.source and self.state == "done" else ""
        return f"{mark} [{self.index}] `{self.title}`{tail}{source}"


def steps_text(steps: Sequence[StepUpdate]) -> str:
    """The checklist of an investigation's steps so far (the newest state of each), one line each."""
    newest: dict[int, StepUpdate] = {}
    for step in steps:
        newest[step.index] = step
    return "\n".join(newest[i].line() for i in sorted(newest))


@dataclass(frozen=True, slots=True)
class ThreadPost:
    """One message of a chat thread as the platform returned it (read back, not pushed to opsbot)."""

    message_id: str
    """Platform id (Slack ``ts``, Mattermost post id)."""
    user: str
    """Author's user id (a bot's user or bot id for bot messages)."""
    text: str
    posted_at: datetime
    user_name: str | None = None
    from_self: bool = False
    """Written by opsbot itself (its answers, alert headers)."""
    is_bot: bool = False
    """Written by another bot, an integration, a webhook or a workflow (the bot policy decides)."""
    bot_ids: tuple[str, ...] = ()
    """Every id a bot author goes by (bot id, bot user id, app id), for ``allowed_bots``."""
    bot_names: tuple[str, ...] = ()
    """Every name a bot author goes by (username, bot or app name, webhook override name)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "text", clean_text(self.text))  # frozen: set once, here


@dataclass(slots=True)
class ThreadRead:
    """A thread read from the platform: its messages oldest first, and what was not read."""

    posts: list[ThreadPost]
    skipped: int = 0
    """Older messages not read (the thread is longer than ``thread.max_messages``); -1: some, count
    unknown."""
    calls: int = 1
    """API calls (pages) it took."""
