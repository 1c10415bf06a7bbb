"""Mattermost: mentions, DMs, thread follow-ups, ``/rca``, streamed answers, feedback buttons.

Events come over the websocket (``/api/v4/websocket``); everything else is REST v4
(:mod:`bot.adapters.mattermost_rest`). The websocket client is our own aiohttp one rather than
mattermostdriver 7.3.2's, whose gaps are too wide to paper over: its ``wss`` context is built
with ``ssl.Purpose.CLIENT_AUTH`` (a server-side context with ``CERT_NONE``, so the server's
certificate is never verified whatever ``verify`` says), it never notices a half-open socket
(it sends unsolicited pongs and awaits nothing), reconnects after a fixed delay without backoff
or jitter, gives no hook to catch up after a reconnect, and loops forever on a failed
authentication.

Never lose a post: every connection is pinged every ``websocket_ping_interval_s`` (at most a third of
``websocket_silence_s``) and must answer within ``websocket_pong_timeout_s``, whatever else it
carries; a connection that misses its pong, stays silent longer than ``websocket_silence_s`` or
closes is replaced, the new one opened before the old one is closed (the server allows several per
user), with backoff and jitter under ``mattermost.reconnect`` (:mod:`bot.retry`). After every
(re)connect it fetches, per watched channel, every post created since the last one it saw (``GET
/channels/{id}/posts?since=``) and handles the ones not yet processed. Duplicates (a post seen live
and in the catch-up, a second replica) are dropped by post id: locally for cheapness, and for good
by the pipeline's ``store.claim_event`` (``IncomingMessage.event_id`` is the post id). The first
connect also looks back a minute, so mentions made while opsbot restarted are answered too.

Every accepted post or command is handed to the pipeline (``submit``), which owns it until it is
answered; who may ask is :mod:`bot.access`'s rule, the same as on Slack, and so is the bot policy:
posts marked ``from_bot`` / ``from_webhook`` / ``from_plugin``, or by bot accounts (``GET
/users/{id}``, cached), are ignored unless allow-listed. The sign of life is a reaction on the
asking post (``POST /reactions``), swapped for a done / failed one when the answer ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from bot.access import AccessPolicy, mattermost_author
from bot.actions.approval import Click
from bot.actions.cards import MATTERMOST_CONTEXT_ACTION, mattermost_props
from bot.adapters.base import ChatAdapter, Housekeeping, MessageSink, ReplyStream
from bot.adapters.mattermost_rest import (
    DEFAULT_MAX_POST_SIZE,
    PLATFORM,
    MattermostAPIError,
    MattermostRest,
    mattermost_error,
    ssl_context,
)
from bot.adapters.ratelimit import BudgetTimeout, Priority, ticket
from bot.adapters.streaming import StreamingReply, format_footer_line, split_text
from bot.adapters.websocket import WebSocketLink
from bot.config import MattermostSettings
from bot.errors import PlatformError, PlatformRejected, StartupError
from bot.http import accepts
from bot.metrics import REPLIES_FAILED
from bot.retry import RetryBudget
from bot.store import Store
from bot.types import FinalAnswer, IncomingMessage, MessageKind, ThreadPost, ThreadRead

if TYPE_CHECKING:
    from bot.actions.cards import Card
    from bot.actions.service import ActionService

logger = logging.getLogger(__name__)

COMMAND_PATH = "/mattermost/command"
"""Where the ``/rca`` custom slash command's request URL points."""
ACTIONS_PATH = "/mattermost/actions"
"""Where feedback buttons' ``integration.url`` points (under ``public_url``)."""

_MAX_PER_PAGE = 200  # the server's web.PerPageMaximum: a larger perPage is refused
_PERMALINK = re.compile(r"https?://[^\s/]+(?:/[^\s/]+)*?/[^\s/]+/pl/(?P<post>[a-z0-9]{26})\b")
_SEEN_MAX = 20_000  # post ids remembered locally (the store is the durable de-duplication)
_CATCHUP_MARGIN_MS = 2_000  # posts may be stored with a create_at slightly behind the last one seen
_STARTUP_LOOKBACK_MS = 60_000  # a restart also answers mentions made just before it (store dedupes)
_USERS_MAX = 10_000  # accounts whose is_bot is remembered
_SIGN = "mattermost_sign_of_life"  # IncomingMessage.extra key: the reaction shown, if any


def feedback_signature(secret: str, request_id: str, value: int) -> str:
    """HMAC of one button's meaning, so a click can be neither forged nor repointed."""
    return hmac.new(secret.encode(), f"{request_id}:{value}".encode(), hashlib.sha256).hexdigest()


def render_footer(answer: FinalAnswer) -> str:
    """The Markdown footer under an answer: a rule, then sources and timings with units."""
    return f"\n\n---\n:mag: {format_footer_line(answer)} · request `{answer.request_id}`"


class MattermostReply(StreamingReply):
    """One answer in a Mattermost thread: a post (placeholder or first text), ``PUT
    /posts/{id}/patch`` edits."""

    edit_method = "PUT /posts/{id}/patch"
    post_method = "POST /posts"

    def __init__(self, adapter: MattermostAdapter, message: IncomingMessage, root_id: str) -> None:
        s = adapter.settings
        super().__init__(
            channel=message.channel,
            thread_id=root_id,
            limit=adapter.max_post_size,
            edit_interval_s=s.edit_interval_s,
            budget=adapter.rest.budget,
            post_placeholder=s.post_placeholder == "always" or not message.extra.get(_SIGN),
        )
        self._adapter = adapter
        self._message = message

    def _final_limit(self, answer: FinalAnswer) -> int:
        return max(16, self.limit - len(render_footer(answer)))

    async def _post(self, text: str, final: FinalAnswer | None) -> str:
        message, props = self._render(text, final)
        post = await self._adapter.rest.create_post(
            self.channel,
            message,
            root_id=self.thread_id,
            props=props,
            pending_post_id=self._adapter.pending_post_id(),
        )
        return str(post["id"])

    async def _edit(self, message_id: str, text: str, final: FinalAnswer | None) -> None:
        message, props = self._render(text, final)
        await self._adapter.rest.patch_post(message_id, message, props)

    def _render(self, text: str, final: FinalAnswer | None) -> tuple[str, dict[str, Any] | None]:
        if final is None:
            return text, None
        return text + render_footer(final), self._adapter.feedback_props(final)


class _WsSession(WebSocketLink):
    """One websocket connection (:class:`WebSocketLink`) and the authentication failure, if any."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        super().__init__(ws)
        self.failure: MattermostAPIError | None = None


class MattermostAdapter(ChatAdapter):
    """The Mattermost connection: websocket events in, REST posts and edits out."""

    platform = PLATFORM
    access: AccessPolicy

    def __init__(self, settings: MattermostSettings, store: Store) -> None:
        self.settings = settings
        self.store = store
        self.access = AccessPolicy(settings, PLATFORM)
        self.rest = MattermostRest(settings)
        self.max_post_size = DEFAULT_MAX_POST_SIZE
        self.bot_user_id = ""
        self.bot_username = ""
        self.ws_connects = 0
        """Websocket sessions that reached ``hello`` (for tests and logs)."""
        self.caught_up_posts = 0
        """Posts handed to the pipeline from a REST catch-up rather than the websocket."""
        self._submit: MessageSink | None = None
        self.channel_filter: Callable[[str], bool] | None = None
        """Answer only the channels this returns True for (``None``: every channel); set in one of
        several workers, which all see every post (``bot/workers.py``)."""
        self._channel_types: dict[str, str] = {}
        self._last_seen: dict[str, int] = {}
        self._pending_since: dict[str, int] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._supervisor: asyncio.Task[None] | None = None
        self._catchup_task: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()
        self._stopping = False
        self._started_ms = 0
        self._last_pending_ms = 0
        self._gap_generation = 0
        self._mention_re: re.Pattern[str] | None = None
        self._users: OrderedDict[str, dict[str, Any] | None] = OrderedDict()
        self._user_lookups: dict[str, asyncio.Future[dict[str, Any] | None]] = {}
        self.ws_replaced = 0
        self.housekeeping = Housekeeping("mattermost")
        self.actions: ActionService | None = None
        """Where Approve / Reject clicks go (``[actions]``; ``None``: actions are off)."""
        """Reaction swaps after answers (background, lowest priority)."""
        """Websocket sessions replaced because they went silent, missed a pong or closed."""
        self._channel_names: dict[str, str | None] = {}

    # -- lifecycle ----------------------------------------------------------------------------
    async def preflight(self) -> None:
        """``GET /users/me`` with the bot's token."""
        await self.rest.start()
        try:
            await self.rest.me()
        except PlatformRejected as exc:
            await self.rest.close()
            raise StartupError(
                f"mattermost.token (OPSBOT_MATTERMOST__TOKEN) was refused by {self.rest.base_url}: {exc}. "
                "Fix: create a new access token for the bot account (System Console > Integrations > "
                "Bot Accounts) and set it"
            ) from None
        except PlatformError as exc:
            await self.rest.close()
            raise StartupError(
                f"Mattermost cannot be reached at {self.rest.base_url}: {exc}. Fix: check mattermost.url, "
                "scheme and port (OPSBOT_MATTERMOST__URL ...) and that the server is up"
            ) from None

    async def start(self, submit: MessageSink) -> None:
        """Log in (``GET /users/me``), read the post limit, list channels, open the websocket."""
        self._submit = submit
        self._stopping = False
        await self.rest.start()
        try:
            me = await self.rest.me()
            self.bot_user_id, self.bot_username = str(me["id"]), str(me.get("username", ""))
            # Usernames may hold '.', '-' and '_': "@opsbot-dev" is someone else, "@opsbot." is us.
            name = re.escape(self.bot_username)
            self._mention_re = re.compile(rf"(?<![\w@.-])@{name}(?![\w-]|\.\w)", re.IGNORECASE)
            self.max_post_size = await self._read_max_post_size()
            self._started_ms = int(time.time() * 1000)
            await self._refresh_channels()
        except BaseException:
            await self.rest.close()  # a failed start leaves nothing open behind it
            raise
        for channel in self._channel_types:
            self._pending_since.setdefault(channel, self._started_ms - _STARTUP_LOOKBACK_MS)
        self._supervisor = asyncio.create_task(self._run_websocket(), name="mattermost-websocket")
        try:
            await asyncio.wait_for(self._listening.wait(), self.settings.request_timeout_s)
        except TimeoutError:
            logger.warning("mattermost websocket not connected yet; still trying in the background")
        logger.info(
            "mattermost connected as @%s (%s), %d channels watched, post limit %d",
            self.bot_username,
            self.bot_user_id,
            len(self._channel_types),
            self.max_post_size,
        )

    async def stop(self) -> None:
        """Stop taking posts and commands: close the websocket, end the catch-up and housekeeping
        tasks. Answers in flight can still post until :meth:`close`."""
        self._stopping = True
        self._submit = None
        for task in (self._supervisor, self._catchup_task, *self._tasks):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._listening.clear()

    async def close(self) -> None:
        """Drop the reaction swaps not done yet, close the REST sessions (after the pipeline
        drained the answers in flight)."""
        await self.housekeeping.close()
        await self.rest.close()

    async def _read_max_post_size(self) -> int:
        try:
            config = await self.rest.client_config()
            return max(16, int(config.get("MaxPostSize") or DEFAULT_MAX_POST_SIZE))
        except (MattermostAPIError, ValueError, TypeError) as exc:
            logger.info(
                "mattermost client config unavailable (%s); post limit %d", exc, DEFAULT_MAX_POST_SIZE
            )
            return DEFAULT_MAX_POST_SIZE

    async def _refresh_channels(self) -> None:
        """Every channel the bot is a member of (DMs and group messages included)."""
        found: dict[str, str] = {}
        for team in await self.rest.my_teams():
            for info in await self.rest.my_channels(str(team["id"])):
                if not info.get("delete_at"):
                    found[str(info["id"])] = str(info.get("type", "O"))
        for channel in set(self._channel_types) - set(found):
            self._forget_channel(channel)
        for channel, ctype in found.items():
            if channel not in self._channel_types and self._last_pending_ms:
                # Joined while disconnected: catch up from when the gap began.
                self._pending_since.setdefault(channel, self._last_pending_ms)
            self._channel_types[channel] = ctype

    def _forget_channel(self, channel: str) -> None:
        self._channel_types.pop(channel, None)
        self._pending_since.pop(channel, None)
        self._last_seen.pop(channel, None)

    # -- websocket ----------------------------------------------------------------------------
    @property
    def websocket_url(self) -> str:
        """``ws(s)://host:port/api/v4/websocket``."""
        scheme = "wss" if self.settings.scheme == "https" else "ws"
        s = self.settings
        return f"{scheme}://{s.url}:{s.port}{s.basepath.rstrip('/')}/websocket"

    async def _run_websocket(self) -> None:
        """Keep one trusted websocket session: when it goes bad, open the next one first and close
        the old one only once the new one said ``hello`` (it may still deliver meanwhile)."""
        budget = RetryBudget(self.settings.reconnect)
        old: _WsSession | None = None
        session: _WsSession | None = None
        try:
            while not self._stopping:
                session = None
                try:
                    session = await self._open_session()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    logger.warning("mattermost websocket failed: %s: %s", type(exc).__name__, exc)
                if session is not None and session.hello.is_set():
                    if old is not None:
                        self.ws_replaced += 1
                        await old.close()
                        old = None
                    budget.reset()  # a session that worked: the next reconnect starts quick again
                    await session.gone.wait()
                    logger.warning("mattermost websocket %s: reconnecting", session.reason)
                    if self._stopping:
                        await session.close()
                        return
                    self._mark_gap()
                    if session.ws.closed:
                        await session.close()
                    else:
                        old = session  # kept until its replacement is up
                elif session is not None:
                    await session.close()
                    if session.reason:
                        logger.warning("mattermost websocket %s", session.reason)
                delay = budget.after_failure("websocket")  # reconnect.max_retries is unset: never gives up
                logger.info(
                    "mattermost websocket reconnecting in %.2f s (attempt %d)", delay, budget.failures
                )
                await asyncio.sleep(delay)
        finally:
            for leftover in (old, session):
                if leftover is not None:
                    await leftover.close()

    def _mark_gap(self, *, disconnected: bool = True) -> None:
        """Events were missed: remember, per channel, from when posts must be fetched again."""
        if disconnected:
            self._listening.clear()
        self._gap_generation += 1
        now = int(time.time() * 1000)
        if not self._pending_since:
            self._last_pending_ms = now
        for channel in self._channel_types:
            self._pending_since.setdefault(channel, self._last_seen.get(channel, self._started_ms))

    async def _open_session(self) -> _WsSession:
        """Connect and authenticate; returns once ``hello`` came, or the session failed first."""
        ws = await self.rest.session.ws_connect(
            self.websocket_url,
            autoping=False,
            ssl=ssl_context(self.settings.verify_tls),
            timeout=aiohttp.ClientWSTimeout(ws_close=1.0),
            max_msg_size=0,
        )
        session = _WsSession(ws)
        session.tasks.append(asyncio.create_task(self._read_session(session), name="mattermost-ws-read"))
        try:
            token = self.settings.token.get_secret_value() if self.settings.token else ""
            await ws.send_str(
                json.dumps({"seq": 1, "action": "authentication_challenge", "data": {"token": token}})
            )
            hello = asyncio.ensure_future(session.hello.wait())
            dead = asyncio.ensure_future(session.gone.wait())
            try:
                await asyncio.wait(
                    {hello, dead}, timeout=self.settings.request_timeout_s, return_when="FIRST_COMPLETED"
                )
            finally:
                hello.cancel()
                dead.cancel()
            if session.failure is not None:
                raise session.failure
            if not session.hello.is_set():
                session.distrust(session.reason or "no hello in time")
                return session
        except BaseException:
            await session.close()
            raise
        interval = min(self.settings.websocket_ping_interval_s, self.settings.websocket_silence_s / 3)
        pong_timeout = self.settings.websocket_pong_timeout_s
        pinger = session.keep_pinging(interval_s=interval, pong_timeout_s=pong_timeout)
        session.tasks.append(asyncio.create_task(pinger, name="mattermost-ws-ping"))
        return session

    async def _read_session(self, session: _WsSession) -> None:
        """Read frames until the socket closes or stays silent; events go to their handlers."""
        silence = self.settings.websocket_silence_s
        expected_seq: int | None = None
        try:
            while True:
                frame = await session.next_json(platform="mattermost", silence_s=silence)
                if frame is None:
                    return
                if "seq_reply" in frame:
                    if frame.get("status") == "FAIL" and frame.get("seq_reply") == 1:
                        session.failure = mattermost_error(
                            "WS",
                            "/websocket",
                            401,
                            str(frame.get("error", {}).get("message", "")),
                            error_id=str(frame.get("error", {}).get("id", "")),
                        )
                        session.distrust("authentication failed")
                        return
                    continue
                seq = frame.get("seq")
                if isinstance(seq, int):
                    if expected_seq is not None and seq != expected_seq:
                        # A hole in the sequence: events were lost on the server side.
                        logger.warning(
                            "mattermost websocket seq %d, expected %d: catching up", seq, expected_seq
                        )
                        self._mark_gap(disconnected=False)
                        self._schedule_catch_up()
                    expected_seq = seq + 1
                event = frame.get("event")
                if event == "hello":
                    self.ws_connects += 1
                    session.hello.set()
                    self._listening.set()
                    self._schedule_catch_up()
                elif event == "posted":
                    await self._on_posted(frame.get("data") or {})
                elif event in ("user_added", "direct_added", "group_added", "channel_created"):
                    self._on_joined(frame)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            session.distrust(f"failed: {type(exc).__name__}: {exc}")

    def _on_joined(self, frame: dict[str, Any]) -> None:
        data = frame.get("data") or {}
        broadcast = frame.get("broadcast") or {}
        channel = str(broadcast.get("channel_id") or data.get("channel_id") or "")
        if frame.get("event") == "user_added" and data.get("user_id") != self.bot_user_id:
            return
        if channel and channel not in self._channel_types:
            self._channel_types[channel] = "O"
            self._spawn(self._learn_channel(channel), f"mattermost-channel-{channel}")

    async def _learn_channel(self, channel: str) -> None:
        with contextlib.suppress(MattermostAPIError):
            info = await self.rest.get_channel(channel)
            self._channel_types[channel] = str(info.get("type", "O"))

    # -- catch-up -----------------------------------------------------------------------------
    def _schedule_catch_up(self) -> None:
        if self._catchup_task is None or self._catchup_task.done():
            self._catchup_task = asyncio.create_task(self._catch_up(), name="mattermost-catch-up")

    async def _catch_up(self) -> None:
        """Fetch posts missed while disconnected; retried until done or the socket drops again."""
        budget = RetryBudget(self.settings.reconnect)
        while self._pending_since and not self._stopping:
            # Only a fetch made while the socket is live closes a gap: posts after it arrive live.
            await self._listening.wait()
            generation = self._gap_generation
            try:
                await self._refresh_channels()
                for channel, since in sorted(self._pending_since.items()):
                    ctype = self._channel_types.get(channel, "O")
                    try:
                        posts = await self.rest.posts_since(channel, since - _CATCHUP_MARGIN_MS)
                    except MattermostAPIError as exc:
                        if exc.status not in (403, 404):
                            raise
                        # Removed from the channel (or it is gone): nothing there to catch up on.
                        logger.info("mattermost catch-up: leaving %s out (%s)", channel, exc)
                        self._forget_channel(channel)
                        continue
                    handled = 0
                    for post in posts:
                        if int(post.get("create_at", 0)) >= since - _CATCHUP_MARGIN_MS:
                            handled += await self._consider(post, ctype, None)
                    self.caught_up_posts += handled
                    if handled:
                        logger.info("mattermost catch-up: %d missed posts in %s", handled, channel)
                    if generation == self._gap_generation:
                        self._pending_since.pop(channel, None)
                if not self._pending_since:
                    self._last_pending_ms = 0
            except MattermostAPIError as exc:
                delay = budget.after_failure("catch-up")
                logger.warning("mattermost catch-up failed (%s); again in %.1f s", exc, delay)
                await asyncio.sleep(delay)

    # -- incoming posts -------------------------------------------------------------------------
    async def _on_posted(self, data: dict[str, Any]) -> None:
        raw = data.get("post")
        try:
            post = json.loads(raw) if isinstance(raw, str) else raw  # JSON inside JSON
        except ValueError:
            logger.warning("mattermost posted event with an unreadable post; ignored")
            return
        if not isinstance(post, dict):
            return
        mentions: list[str] | None = None
        if isinstance(data.get("mentions"), str):
            with contextlib.suppress(ValueError):
                mentions = list(json.loads(data["mentions"]))
        channel = str(post.get("channel_id", ""))
        ctype = str(data.get("channel_type") or self._channel_types.get(channel, "O"))
        self._channel_types.setdefault(channel, ctype)
        # In its own task: a user look-up or a store query must not hold up the next frames.
        self._spawn(self._consider(post, ctype, mentions), f"mattermost-post-{post.get('id', '')}")

    async def _consider(self, post: dict[str, Any], ctype: str, mentions: list[str] | None) -> int:
        """Turn one post into a message for the pipeline if opsbot should answer it; 1 if so."""
        post_id = str(post.get("id", ""))
        channel = str(post.get("channel_id", ""))
        if self.channel_filter is not None and not self.channel_filter(channel):
            return 0  # another worker's channel
        create_at = int(post.get("create_at", 0))
        if create_at > self._last_seen.get(channel, 0):
            self._last_seen[channel] = create_at
        if not post_id or post_id in self._seen:
            return 0
        self._seen[post_id] = None
        if len(self._seen) > _SEEN_MAX:
            self._seen.popitem(last=False)
        user = str(post.get("user_id", ""))
        if (
            user == self.bot_user_id
            or str(post.get("type", "")).startswith("system_")
            or post.get("delete_at")
        ):
            return 0
        text = str(post.get("message", ""))
        root_id = str(post.get("root_id") or "")
        mentioned = (mentions is not None and self.bot_user_id in mentions) or bool(
            self._mention_re and self._mention_re.search(text)
        )
        if ctype == "D":
            kind = MessageKind.DIRECT
        elif mentioned:
            kind = MessageKind.MENTION
        elif root_id and await self._is_bot_thread(channel, root_id, create_at / 1000 or None):
            kind = MessageKind.FOLLOWUP
        else:
            return 0
        # Only a post opsbot would answer costs a user look-up (cached): bots never answer bots.
        author = mattermost_author(post, await self._user(user))
        if self.access.ignores_bot(author):
            logger.debug("mattermost: ignored a %s post by %s in %s", author.form, user, channel)
            return 0
        if self._mention_re is not None:
            text = self._mention_re.sub("", text).strip()
        message = IncomingMessage(
            platform=PLATFORM,
            event_id=post_id,
            channel=channel,
            user=user,
            text=text,
            kind=kind,
            thread_id=root_id or post_id,
            message_id=post_id,
            posted_at=create_at / 1000 or None,
            is_direct=ctype == "D",
        )
        return 1 if self._hand_over(message) else 0

    async def _user(self, user_id: str) -> dict[str, Any] | None:
        """The account behind a post (``GET /users/{id}``), remembered; ``None`` when unknown."""
        if user_id in self._users:
            self._users.move_to_end(user_id)
            return self._users[user_id]
        pending = self._user_lookups.get(user_id)
        if pending is None:  # one look-up per account, however many of its posts arrive at once
            pending = self._user_lookups[user_id] = asyncio.ensure_future(self._look_up(user_id))
        try:
            return await asyncio.shield(pending)
        finally:
            if pending.done():
                self._user_lookups.pop(user_id, None)

    async def _look_up(self, user_id: str) -> dict[str, Any] | None:
        try:
            with ticket(Priority.ACK):  # on the way to the sign of life
                user: dict[str, Any] | None = await self.rest.get_user(user_id)
        except MattermostAPIError as exc:
            # Unknown is not remembered: the props checks still apply, the next post asks again.
            logger.info("mattermost: cannot look up user %s (%s)", user_id, exc)
            return None
        self._users[user_id] = user
        while len(self._users) > _USERS_MAX:
            self._users.popitem(last=False)
        return user

    async def _is_bot_thread(self, channel: str, root_id: str, posted_at: float | None) -> bool:
        try:
            return await self.store.is_bot_thread(PLATFORM, channel, root_id, posted_at)
        except Exception as exc:  # the event stream must go on; the store logs its own outage
            logger.warning("mattermost: cannot tell whether thread %s is opsbot's: %s", root_id, exc)
            return False

    def _hand_over(self, message: IncomingMessage) -> bool:
        """Give an accepted message to the pipeline, which owns it from here (claim, access, answer)."""
        if self._submit is None:
            logger.warning(
                "mattermost post arrived while stopping: %s not taken",
                message.event_id,
                extra={"request_id": message.request_id},
            )
            return False
        self._submit(message)  # the pipeline sets the request's id for everything it does
        return True

    def _spawn(self, coro: Any, name: str) -> None:
        """A housekeeping task of the adapter's own (never an answer: those are the pipeline's)."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("mattermost task %s failed", task.get_name(), exc_info=task.exception())

    # -- replies ------------------------------------------------------------------------------
    def pending_post_id(self) -> str:
        """A fresh ``pending_post_id`` (``user_id:ms``): the server's create de-duplication key."""
        return f"{self.bot_user_id}:{int(time.time() * 1000)}{uuid.uuid4().hex[:8]}"

    def feedback_props(self, answer: FinalAnswer) -> dict[str, Any] | None:
        """Post props with 👍 / 👎 interactive buttons, or ``None`` when buttons cannot work."""
        s = self.settings
        if not answer.feedback or not s.public_url or s.action_secret is None:
            return None
        secret = s.action_secret.get_secret_value()
        url = s.public_url.rstrip("/") + ACTIONS_PATH

        def button(action_id: str, name: str, value: int) -> dict[str, Any]:
            context = {
                "action": "feedback",
                "request_id": answer.request_id,
                "value": value,
                "sig": feedback_signature(secret, answer.request_id, value),
            }
            return {
                "id": action_id,
                "name": name,
                "type": "button",
                "integration": {"url": url, "context": context},
            }

        actions = [button("feedbackup", "👍", 1), button("feedbackdown", "👎", -1)]
        return {"attachments": [{"text": "", "actions": actions}]}

    async def acknowledge(self, message: IncomingMessage) -> None:
        """A reaction (``ack_reaction``) on the asking post, at once; skipped when the budget is spent."""
        s = self.settings
        if message.kind in (MessageKind.COMMAND, MessageKind.ALERT) or not message.message_id:
            return
        if s.ack_reaction and await self._react(
            message.message_id, s.ack_reaction, Priority.ACK, s.ack_wait_s
        ):
            message.extra[_SIGN] = s.ack_reaction

    async def conclude(self, message: IncomingMessage, *, ok: bool) -> None:
        """Swap the sign of life for ``done_reaction`` / ``failed_reaction``, in the background at
        the lowest priority (signs of life for new questions go first)."""
        shown = message.extra.get(_SIGN)
        post_id = message.message_id
        if not isinstance(shown, str) or not post_id:
            return
        mark = self.settings.done_reaction if ok else self.settings.failed_reaction

        async def swap() -> None:
            with ticket(Priority.BACKGROUND):
                try:
                    await self.rest.remove_reaction(self.bot_user_id, post_id, shown)
                    if mark:
                        await self.rest.add_reaction(self.bot_user_id, post_id, mark)
                except MattermostAPIError as exc:
                    logger.info("mattermost reaction swap on %s failed: %s", post_id, exc)

        self.housekeeping.add(swap)

    async def _react(
        self, post_id: str, emoji: str, priority: Priority, wait_s: float, *, remove: bool = False
    ) -> bool:
        """Add (or remove) one reaction without ever holding an answer up; True when it worked."""
        call = self.rest.remove_reaction if remove else self.rest.add_reaction
        try:
            with ticket(priority):
                await asyncio.wait_for(
                    call(
                        self.bot_user_id,
                        post_id,
                        emoji,
                        retries=1,
                        patience_s=max(wait_s, 0.01),
                        max_wait_s=wait_s,
                    ),
                    wait_s + 5.0,
                )
            return True
        except BudgetTimeout:
            logger.info("mattermost reaction %s skipped: no budget slot within %.1f s", emoji, wait_s)
        except (MattermostAPIError, TimeoutError) as exc:
            logger.info("mattermost reaction %s on %s failed: %s", emoji, post_id, exc)
        return False

    async def open_reply(self, message: IncomingMessage) -> ReplyStream:
        """Post the placeholder in the message's thread (started at the message when top-level);
        a ``/rca`` command first gets a channel post quoting the request, to thread under."""
        root = message.thread_id or message.message_id
        if not root:
            asker = f"@{message.user_name}" if message.user_name else "someone"
            quote = "\n".join(f"> {line}" for line in f"/rca {message.text}".splitlines())
            with ticket(Priority.ACK):
                post = await self.rest.create_post(
                    message.channel, f"{asker} asked:\n{quote}", pending_post_id=self.pending_post_id()
                )
            root = message.thread_id = message.message_id = str(post["id"])
            self._seen[root] = None
        reply = MattermostReply(self, message, root)
        await reply.start()
        return reply

    async def send_notice(self, message: IncomingMessage, text: str, *, ephemeral: bool = False) -> None:
        """Help, status and refusals: in the command's response when it can still carry it, then
        to its ``response_url``; ephemeral posts elsewhere (a thread post if that is refused)."""
        if message.settle_first_word(text):  # the command's own response carries it
            return
        try:
            response_url = message.extra.get("response_url")
            if isinstance(response_url, str) and response_url:
                kind = "ephemeral" if ephemeral else "in_channel"
                await self.rest.command_response(response_url, {"response_type": kind, "text": text})
                return
            root = message.thread_id or message.message_id or ""
            if ephemeral:
                try:
                    await self.rest.create_ephemeral(message.user, message.channel, text, root)
                    return
                except MattermostAPIError as exc:
                    if exc.status not in (401, 403):
                        raise
                    logger.info("ephemeral posts not allowed (%s); answering in the thread", exc)
            await self.rest.create_post(
                message.channel, text, root_id=root, pending_post_id=self.pending_post_id()
            )
        except MattermostAPIError as exc:
            REPLIES_FAILED.labels(platform=PLATFORM).inc()
            logger.error("mattermost notice for %s not delivered: %s", message.event_id, exc)

    async def post_to_channel(self, channel: str, text: str, thread_id: str | None = None) -> str:
        """Post ``text`` (Markdown) to ``channel``, in ``thread_id`` when given; the thread's id."""
        chunks = split_text(text, self.max_post_size)
        root = thread_id or ""
        first = ""
        for chunk in chunks:
            post = await self.rest.create_post(
                channel, chunk, root_id=root, pending_post_id=self.pending_post_id()
            )
            first = first or str(post["id"])
            root = root or first
        return thread_id or first

    # -- threads and files (the thread as context, postmortem drafts) --------------------------
    async def read_thread(
        self, channel: str, thread_id: str, *, limit: int, page_size: int = 200
    ) -> ThreadRead:
        """``GET /posts/{id}/thread`` page by page, newest first (``direction=up``, ``perPage``, then
        ``fromCreateAt`` / ``fromPost`` of the oldest post read), until ``has_next`` is false or
        ``limit`` posts are read; returned oldest first."""
        per_page = min(page_size, _MAX_PER_PAGE)
        posts: dict[str, dict[str, Any]] = {}
        calls = 0
        oldest: dict[str, Any] | None = None
        more = False
        while True:
            page = await self.rest.thread_page(
                thread_id,
                per_page=per_page,
                from_create_at=int(oldest["create_at"]) if oldest else 0,
                from_post=str(oldest["id"]) if oldest else "",
            )
            calls += 1
            found = page.get("posts") or {}
            for post_id in page.get("order") or []:
                post = found.get(post_id)
                if isinstance(post, dict) and post.get("channel_id") == channel and not post.get("delete_at"):
                    posts.setdefault(str(post_id), post)
            replies = [p for p in found.values() if isinstance(p, dict) and p.get("root_id")]
            more = bool(page.get("has_next"))
            if not more or not replies or len(posts) >= limit:
                break
            oldest = min(replies, key=lambda p: (int(p.get("create_at", 0)), str(p.get("id"))))
        ordered = sorted(posts.values(), key=lambda p: (int(p.get("create_at", 0)), str(p.get("id"))))
        ordered = [p for p in ordered if not str(p.get("type", "")).startswith("system_")]
        kept = ordered[-limit:]
        skipped = len(ordered) - len(kept) or (-1 if more else 0)
        users = await self._accounts({str(p.get("user_id", "")) for p in kept})
        return ThreadRead([self._thread_post(p, users) for p in kept], skipped=skipped, calls=calls)

    def _thread_post(self, post: dict[str, Any], users: dict[str, dict[str, Any]]) -> ThreadPost:
        user_id = str(post.get("user_id", ""))
        user = users.get(user_id)
        own = user_id == self.bot_user_id
        author = mattermost_author(post, user)  # the bot policy's own reading of who wrote it
        text = str(post.get("message", ""))
        if self._mention_re is not None:
            text = self._mention_re.sub("@opsbot", text)
        for file in (post.get("metadata") or {}).get("files") or []:
            if isinstance(file, dict):
                text += f" [shared file: {file.get('name') or file.get('id')}]"
        is_bot = author.is_bot and not own
        name = (post.get("props") or {}).get("override_username") or (user or {}).get("username")
        return ThreadPost(
            message_id=str(post.get("id", "")),
            user=user_id,
            text=text,
            posted_at=datetime.fromtimestamp(int(post.get("create_at", 0)) / 1000, UTC),
            user_name=str(name) if name else None,
            from_self=own,
            is_bot=is_bot,
            bot_ids=author.ids if is_bot else (),
            bot_names=author.names if is_bot else (),
        )

    async def _accounts(self, user_ids: set[str]) -> dict[str, dict[str, Any]]:
        """Accounts of ``user_ids`` (the adapter's one remembered look-up per account)."""
        ids = [u for u in user_ids if u]
        found = await asyncio.gather(*(self._user(u) for u in ids))
        return {u: account for u, account in zip(ids, found, strict=True) if account is not None}

    async def channel_name(self, channel: str) -> str | None:
        """The channel's name (``GET /channels/{id}``), remembered; ``None`` when it cannot be read."""
        if channel not in self._channel_names:
            try:
                info = await self.rest.get_channel(channel)
            except MattermostAPIError as exc:
                logger.info("mattermost channel %s: %s", channel, exc)
                return None
            self._channel_names[channel] = str(info.get("name") or "") or None
        return self._channel_names[channel]

    async def thread_from_link(self, text: str, channel: str) -> str | None:
        """The thread of a Mattermost permalink (``https://host/<team>/pl/<post_id>``) to a post of
        ``channel``: the post's root, or the post itself when it is one."""
        for found in _PERMALINK.finditer(text):
            post = await self.rest.get_post(found.group("post"))
            if post.get("channel_id") == channel:
                return str(post.get("root_id") or post.get("id"))
        return None

    async def upload_file(
        self, channel: str, thread_id: str, *, filename: str, content: bytes, title: str, comment: str
    ) -> str:
        """``POST /files`` (multipart), then a post in the thread with the file's id in ``file_ids``."""
        info = await self.rest.upload_file(channel, filename, content)
        file_id = str(info["id"])
        await self.rest.create_post(
            channel,
            comment,
            root_id=thread_id,
            pending_post_id=self.pending_post_id(),
            file_ids=[file_id],
        )
        return file_id

    # -- HTTP: slash command and button actions ------------------------------------------------
    def http_routes(self) -> list[web.RouteDef]:
        """``POST /mattermost/command`` (``/rca``) and ``POST /mattermost/actions`` (buttons)."""
        return [web.post(COMMAND_PATH, self._on_command), web.post(ACTIONS_PATH, self._on_action)]

    @accepts("application/x-www-form-urlencoded")  # what Mattermost sends for a POST command
    async def _on_command(self, request: web.Request) -> web.Response:
        try:
            form = await request.post()
        except ValueError:  # undecodable form (bad charset, bytes that are not UTF-8)
            return web.json_response({"error": "malformed slash command form"}, status=400)
        expected = self.settings.slash_command_token
        token = str(form.get("token", ""))
        if expected is None or not hmac.compare_digest(token.encode(), expected.get_secret_value().encode()):
            logger.warning("mattermost slash command with a bad token from %s refused", request.remote)
            return web.json_response({"error": "invalid slash command token"}, status=401)
        if self._submit is None:
            return _ephemeral(":hourglass: opsbot is starting or restarting; try again in a moment.")
        text = str(form.get("text", "")).strip()
        trigger = str(form.get("trigger_id", "")) or uuid.uuid4().hex
        channel = str(form.get("channel_id", ""))
        message = IncomingMessage(
            platform=PLATFORM,
            event_id="cmd:" + hashlib.sha256(trigger.encode()).hexdigest()[:32],
            channel=channel,
            user=str(form.get("user_id", "")),
            user_name=str(form.get("user_name", "")) or None,
            team=str(form.get("team_id", "")) or None,
            text=text,
            kind=MessageKind.COMMAND,
            is_direct=self._channel_types.get(channel) == "D",
            extra={"response_url": str(form.get("response_url", ""))},
        )
        # The pipeline decides (access, command words); a short answer (a refusal, help, status)
        # rides on this response when it comes in time, else it goes to the response_url.
        message.first_word = asyncio.get_running_loop().create_future()
        self._hand_over(message)
        first = await message.wait_first_word(self.settings.slash_command_wait_s)
        if first is not None:
            return _ephemeral(first)
        if message.first_word.cancelled():  # no word in time
            return _ephemeral(":hourglass: Working on it…")
        return _ephemeral(
            ":mag: Looking into it — the answer will be in a thread under your request in this channel."
        )

    @accepts("application/json")
    async def _on_action(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"error": "expected a JSON action request"}, status=400)
        context = body.get("context") if isinstance(body, dict) else None
        if isinstance(context, dict) and context.get("action") == MATTERMOST_CONTEXT_ACTION:
            return await self._on_action_click(body, context)
        secret = self.settings.action_secret
        if not isinstance(context, dict) or secret is None:
            return web.json_response({"error": "invalid action"}, status=401)
        request_id = str(context.get("request_id", ""))
        value = context.get("value")
        sig = str(context.get("sig", ""))
        if (
            value not in (1, -1)
            or not request_id
            or not hmac.compare_digest(
                sig, feedback_signature(secret.get_secret_value(), request_id, int(value))
            )
        ):
            logger.warning("mattermost action with a bad signature from %s refused", request.remote)
            return web.json_response({"error": "invalid action signature"}, status=401)
        user = str(body.get("user_id", "")) or None
        await self.store.record_feedback(request_id, PLATFORM, user, int(value))
        logger.info("feedback %+d on request %s from %s", value, request_id, user)
        thanks = "👍" if value == 1 else "👎"
        return web.json_response({"ephemeral_text": f"Thanks, your {thanks} was recorded."})

    async def _on_action_click(self, body: dict[str, Any], context: dict[str, Any]) -> web.Response:
        # Mattermost does not sign these requests. What makes a click trustworthy: the button's
        # value is HMAC-signed by opsbot (bot.actions.approval) and travels in integration.context,
        # which the server strips from every post it sends to clients, so only the Mattermost
        # server (which fills in user_id from the clicker's session) can send it back.
        user = str(body.get("user_id", ""))
        channel = str(body.get("channel_id", ""))
        if not user or not channel:
            return web.json_response({"error": "invalid action request"}, status=400)
        if self.actions is None:
            return web.json_response(
                {"ephemeral_text": ":no_entry: Actions are turned off here; nothing was done."}
            )
        name = body.get("user_name")
        click = Click(PLATFORM, str(context.get("value", "")), user, channel, str(name) if name else None)
        return web.json_response({"ephemeral_text": await self.actions.decide(click)})

    async def post_card(self, channel: str, thread_id: str | None, card: Card) -> str:
        """Post a proposal card (an attachment with Approve / Reject actions); its post id."""
        props = mattermost_props(card, self._actions_url())
        post = await self.rest.create_post(
            channel, "", root_id=thread_id or "", props=props, pending_post_id=self.pending_post_id()
        )
        return str(post["id"])

    async def update_card(self, channel: str, card_id: str, card: Card) -> None:
        """Replace a posted card (``PUT /posts/{id}/patch``): decided, its buttons gone."""
        await self.rest.patch_post(card_id, "", mattermost_props(card, self._actions_url()))

    def _actions_url(self) -> str | None:
        url = self.settings.public_url
        return url.rstrip("/") + ACTIONS_PATH if url else None


def _ephemeral(text: str) -> web.Response:
    return web.json_response({"response_type": "ephemeral", "text": text})
