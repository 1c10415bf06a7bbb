"""Slack: @-mentions, DMs, ``/rca`` and thread follow-ups, streamed into threads (slack-bolt async).

Both connection modes share one bolt ``AsyncApp``: Socket Mode (``AsyncSocketModeHandler``, the
websocket URL comes from ``apps.connections.open`` on ``settings.api_base_url``) or the HTTP Events
API (:meth:`SlackAdapter.http_routes`: one Request URL for events, slash commands and
interactivity, every request's v0 signature and timestamp verified here before bolt sees it).

Every delivery is acknowledged at once and its work scheduled as a task. ``event_id`` is
``channel:ts`` of the user's message, so the ``app_mention`` and ``message`` events Slack sends for
one mention, and every retry of either (``X-Slack-Retry-Num`` / Socket Mode ``retry_attempt``), claim
the same key in the store and only the first is answered.

Web API calls go through :meth:`SlackAdapter.call`: 429s wait their ``Retry-After`` (and hold back
every other call of that method to that channel meanwhile), 5xx and connection errors back off
with jitter, each retry counted in ``CHAT_API_RETRIES``. New posts to a channel are paced by a
shared :class:`~bot.adapters.streaming.ChannelPacer`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient

from bot.adapters.base import ChatAdapter, MessageHandler, ReplyStream
from bot.adapters.slack_format import (
    FEEDBACK_DOWN,
    FEEDBACK_UP,
    answer_blocks,
    escape,
    fallback_text,
    markdown_to_mrkdwn,
)
from bot.adapters.streaming import ChannelPacer, ReplyDeliveryError, StreamingReply
from bot.config import SlackSettings
from bot.metrics import CHAT_API_RETRIES, REPLIES_FAILED
from bot.types import FinalAnswer, IncomingMessage, MessageKind

if TYPE_CHECKING:
    from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler

    from bot.store import Store

logger = logging.getLogger(__name__)

PLATFORM = "slack"
SIGNATURE_MAX_AGE_S = 300
"""Slack's replay window: a request timestamp older (or newer) than this is refused."""
_BACKOFF_MAX_S = 30.0
_QUOTE_LIMIT = 500


class SlackCallError(Exception):
    """A Web API call failed for good (a permanent error, or retries exhausted)."""

    def __init__(self, method: str, error: str) -> None:
        super().__init__(f"{method}: {error}")
        self.method = method
        self.error = error


class _RetryAfterGates:
    """Honours ``Retry-After``: after a 429 no call of that method to that channel starts early."""

    def __init__(self) -> None:
        self._until: dict[tuple[str, str | None], float] = {}

    async def wait(self, method: str, channel: str | None) -> None:
        while True:
            delay = self._until.get((method, channel), 0.0) - time.monotonic()
            if delay <= 0:
                return
            await asyncio.sleep(delay)

    def block(self, method: str, channel: str | None, seconds: float) -> None:
        key = (method, channel)
        self._until[key] = max(self._until.get(key, 0.0), time.monotonic() + seconds)


class SlackReply(StreamingReply):
    """One answer in a Slack thread: ``chat.postMessage`` placeholder, ``chat.update`` edits."""

    def __init__(self, adapter: SlackAdapter, message: IncomingMessage, thread_ts: str) -> None:
        settings = adapter.settings
        super().__init__(
            channel=message.channel,
            thread_id=thread_ts,
            limit=settings.message_limit,
            edit_interval_s=settings.edit_interval_s,
            pacer=adapter.pacer,
        )
        self._adapter = adapter
        self._event_id = message.event_id

    def _format(self, text: str) -> str:
        return markdown_to_mrkdwn(text)

    async def _post(self, text: str, final: FinalAnswer | None) -> str:
        params: dict[str, Any] = {
            "channel": self.channel,
            "thread_ts": self.thread_id,
            "text": fallback_text(text),
            "unfurl_links": False,
            "unfurl_media": False,
        }
        if final is not None:
            params["blocks"] = answer_blocks(text, final)
        data = await self._adapter.call("chat.postMessage", params, channel=self.channel)
        return str(data["ts"])

    async def _edit(self, message_id: str, text: str, final: FinalAnswer | None) -> None:
        params: dict[str, Any] = {"channel": self.channel, "ts": message_id, "text": fallback_text(text)}
        if final is not None:
            params["blocks"] = answer_blocks(text, final)
        await self._adapter.call("chat.update", params, channel=self.channel)


class SlackAdapter(ChatAdapter):
    """opsbot on Slack, in Socket Mode or HTTP mode as ``settings.mode`` says."""

    platform = PLATFORM

    def __init__(self, settings: SlackSettings, store: Store) -> None:
        if settings.bot_token is None:
            raise ValueError("slack.bot_token is required")
        self.settings = settings
        self.store = store
        self.pacer = ChannelPacer(interval_s=settings.channel_post_interval_s)
        # Retries are ours (see `call`): the pacer must see every attempt, so slack-sdk's own
        # retry handlers are turned off.
        self.client = AsyncWebClient(
            token=settings.bot_token.get_secret_value(),
            base_url=settings.api_base_url,
            retry_handlers=[],
        )
        self._verifier = (
            SignatureVerifier(settings.signing_secret.get_secret_value())
            if settings.signing_secret is not None
            else None
        )
        self._gates = _RetryAfterGates()
        self._handler: MessageHandler | None = None
        self._socket: AsyncSocketModeHandler | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.bot_user_id: str | None = None
        self.bot_id: str | None = None
        self.app = self._build_app()

    # -- lifecycle --------------------------------------------------------------------------------
    def _build_app(self) -> AsyncApp:
        app = AsyncApp(
            client=self.client,
            # signatures are checked in `_http_endpoint` (so a refusal never logs the body)
            request_verification_enabled=False,
            signing_secret="unused",
            process_before_response=False,
            logger=logging.getLogger("bot.adapters.slack.bolt"),
        )
        app.event("app_mention")(self._on_app_mention)
        app.event("message")(self._on_message)
        app.command(self.settings.command)(self._on_command)
        app.action(re.compile(rf"^({FEEDBACK_UP}|{FEEDBACK_DOWN}):"))(self._on_feedback)
        return app

    async def start(self, handler: MessageHandler) -> None:
        """Learn the bot's own ids (``auth.test``), then connect (Socket Mode) or await HTTP posts."""
        self._handler = handler
        auth = await self.call("auth.test", {})
        self.bot_user_id = str(auth.get("user_id") or "") or None
        self.bot_id = str(auth.get("bot_id") or "") or None
        if self.settings.mode == "socket":
            from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler

            if self.settings.app_token is None:
                raise ValueError("slack.app_token (xapp-...) is required in socket mode")
            app_token = self.settings.app_token.get_secret_value()
            # slack-sdk retries a failing apps.connections.open forever; asking once ourselves
            # turns a wrong app token into a clear start() error, and the URL is used right away
            opened = await self.call("apps.connections.open", {}, token=app_token)
            self._socket = AsyncSocketModeHandler(
                self.app,
                app_token=app_token,
                web_client=self.client,
                ping_interval=self.settings.socket_ping_interval_s,
                logger=logging.getLogger("bot.adapters.slack.socket"),
            )
            self._socket.client.wss_uri = str(opened["url"])
            await self._socket.connect_async()  # type: ignore[no-untyped-call]
        elif self._verifier is None:
            raise ValueError("slack.signing_secret is required in http mode")
        logger.info("slack connected: mode=%s bot_user=%s", self.settings.mode, self.bot_user_id)

    async def stop(self) -> None:
        """Disconnect, let answers in progress finish for ``drain_timeout_s``, cancel the rest."""
        if self._socket is not None:
            await self._socket.close_async()  # type: ignore[no-untyped-call]
            self._socket = None
        pending = set(self._tasks)
        if pending:
            _, late = await asyncio.wait(pending, timeout=self.settings.drain_timeout_s)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=5)
                logger.warning("slack stop: %d answers cancelled after the drain timeout", len(late))

    # -- Web API --------------------------------------------------------------------------------
    async def call(
        self,
        method: str,
        params: Mapping[str, Any],
        *,
        channel: str | None = None,
        token: str | None = None,
    ) -> dict[str, Any]:
        """One Web API call with retries: 429 waits ``Retry-After``, 5xx / connection errors back off.

        ``token`` replaces the bot token (the app-level token for ``apps.connections.open``).
        Raises :class:`SlackCallError` on a permanent error or when retries are exhausted.
        """
        headers = {"Authorization": f"Bearer {token}"} if token else None
        attempt = 0  # failures (5xx, connection errors): bounded by max_retries
        started = time.monotonic()  # rate limits: bounded by rate_limit_patience_s
        while True:
            await self._gates.wait(method, channel)
            reason: str
            delay: float
            try:
                resp = await self.client.api_call(method, json=dict(params), headers=headers)
                return dict(resp.data) if isinstance(resp.data, dict) else {}
            except SlackApiError as exc:
                status = exc.response.status_code
                error = (
                    str((exc.response.data or {}).get("error", ""))
                    if isinstance(exc.response.data, dict)
                    else ""
                )
                if status == 429:
                    reason = "ratelimited"
                    delay = _retry_after(exc.response.headers) + random.uniform(0.05, 0.25)
                    self._gates.block(method, channel, delay)
                elif status >= 500:
                    reason = "server_error"
                    delay = self._backoff(attempt)
                else:
                    raise SlackCallError(method, error or f"HTTP {status}") from exc
                detail = error or f"HTTP {status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                reason, delay, detail = "connection", self._backoff(attempt), type(exc).__name__
            if reason == "ratelimited":
                # A 429 is Slack saying "wait", not a failure: keep honouring Retry-After until the
                # patience runs out, so a busy channel delays an answer instead of losing it.
                waited = time.monotonic() - started
                if waited + delay > self.settings.rate_limit_patience_s:
                    raise SlackCallError(method, f"{detail}: still rate limited after {waited:.0f} s")
            elif attempt >= self.settings.max_retries:
                raise SlackCallError(method, f"{detail} after {attempt} retries")
            else:
                attempt += 1
            CHAT_API_RETRIES.labels(PLATFORM, method, reason).inc()
            logger.info(
                "slack %s retry %d in %.2f s: %s (channel=%s)", method, attempt, delay, detail, channel
            )
            await asyncio.sleep(delay)

    def _backoff(self, attempt: int) -> float:
        base = min(_BACKOFF_MAX_S, self.settings.retry_backoff_s * 2.0**attempt)
        return base / 2 + random.uniform(0, base / 2)

    async def _post_paced(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = str(params["channel"])
        async with self.pacer.turn(channel):
            return await self.call("chat.postMessage", params, channel=channel)

    # -- ChatAdapter ---------------------------------------------------------------------------
    async def open_reply(self, message: IncomingMessage) -> ReplyStream:
        """Placeholder in the message's thread; ``/rca`` first gets a channel message to thread under."""
        try:
            thread_ts = message.thread_id
            if thread_ts is None:
                quote = escape(message.text[:_QUOTE_LIMIT]) + (
                    "…" if len(message.text) > _QUOTE_LIMIT else ""
                )
                who = f"<@{message.user}>"
                quoted = "\n".join(f">{line}" for line in quote.split("\n"))
                text = (
                    f"{who} asked `{self.settings.command}`:\n{quoted}" if quote else f"{who} asked for help"
                )
                data = await self._post_paced({"channel": message.channel, "text": text})
                thread_ts = str(data["ts"])
                message.thread_id = thread_ts
            reply = SlackReply(self, message, thread_ts)
            await reply.start()
        except SlackCallError as exc:
            # the pipeline counts it (REPLIES_FAILED) and logs it with the request id
            logger.error(
                "slack reply not started: event_id=%s channel=%s error=%s",
                message.event_id,
                message.channel,
                exc,
            )
            raise ReplyDeliveryError(str(exc)) from exc
        return reply

    async def send_notice(self, message: IncomingMessage, text: str, *, ephemeral: bool = False) -> None:
        """Ephemeral: only the asker sees it (``chat.postEphemeral``); else a post in the thread."""
        body = markdown_to_mrkdwn(text)
        try:
            if ephemeral:
                params: dict[str, Any] = {"channel": message.channel, "user": message.user, "text": body}
                if message.thread_id and message.kind != MessageKind.COMMAND:
                    params["thread_ts"] = message.thread_id
                await self.call("chat.postEphemeral", params, channel=message.channel)
            else:
                params = {"channel": message.channel, "text": body}
                thread = message.thread_id or message.message_id
                if thread:
                    params["thread_ts"] = thread
                await self._post_paced(params)
        except SlackCallError as exc:
            REPLIES_FAILED.labels(PLATFORM).inc()
            logger.error(
                "slack notice not delivered: event_id=%s channel=%s error=%s",
                message.event_id,
                message.channel,
                exc,
            )

    async def post_to_channel(self, channel: str, text: str, thread_id: str | None = None) -> str:
        """Post a plain message (alert threads); returns its ``ts``."""
        params: dict[str, Any] = {"channel": channel, "text": fallback_text(markdown_to_mrkdwn(text))}
        if thread_id:
            params["thread_ts"] = thread_id
        data = await self._post_paced(params)
        return str(data["ts"])

    # -- HTTP mode -----------------------------------------------------------------------------
    def http_routes(self) -> list[web.RouteDef]:
        """``POST settings.events_path``: events, slash commands and interactivity (one Request URL)."""
        if self.settings.mode != "http":
            return []
        return [web.post(self.settings.events_path, self._http_endpoint)]

    async def _http_endpoint(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        timestamp = request.headers.get("X-Slack-Request-Timestamp", "")
        signature = request.headers.get("X-Slack-Signature", "")
        problem = self._signature_problem(body, timestamp, signature)
        if problem is not None:
            # never log the body: it is unauthenticated input and may carry user text
            logger.warning(
                "slack request refused (401): %s; path=%s remote=%s timestamp=%r",
                problem,
                request.path,
                request.remote,
                timestamp[:20],
            )
            return web.json_response({"error": "invalid request"}, status=401)
        headers: dict[str, str | Sequence[str]] = {k.lower(): v for k, v in request.headers.items()}
        bolt_request = AsyncBoltRequest(
            body=body.decode("utf-8", errors="replace"), query=request.query_string, headers=headers
        )
        bolt_response = await self.app.async_dispatch(bolt_request)
        return await to_aiohttp_response(bolt_response)

    def _signature_problem(self, body: bytes, timestamp: str, signature: str) -> str | None:
        if self._verifier is None:
            return "no signing secret configured"
        if not timestamp or not signature:
            return "missing signature headers"
        try:
            age = abs(time.time() - int(timestamp))
        except ValueError:
            return "malformed timestamp"
        if age > SIGNATURE_MAX_AGE_S:
            return f"stale timestamp ({age:.0f} s old)"
        if not self._verifier.is_valid(body, timestamp, signature):
            return "bad signature"
        return None

    # -- inbound ------------------------------------------------------------------------------
    async def _on_app_mention(self, event: dict[str, Any], body: dict[str, Any]) -> None:
        if self._is_own(event):
            return
        message = self._normalise(event, body, MessageKind.MENTION)
        if message is not None:
            await self._accept(message)

    async def _on_message(self, event: dict[str, Any], body: dict[str, Any]) -> None:
        # every subtype is skipped: edits, deletions, joins, bot messages, ...
        if event.get("subtype") or self._is_own(event) or not event.get("user"):
            return
        channel = str(event.get("channel", ""))
        ts = str(event.get("ts", ""))
        thread_ts = event.get("thread_ts")
        if event.get("channel_type") == "im":
            kind = MessageKind.DIRECT
        elif self.bot_user_id and f"<@{self.bot_user_id}>" in str(event.get("text", "")):
            return  # the app_mention event for this message answers it
        elif (
            thread_ts
            and thread_ts != ts
            and await self.store.is_bot_thread(PLATFORM, channel, str(thread_ts))
        ):
            kind = MessageKind.FOLLOWUP
        else:
            return
        message = self._normalise(event, body, kind)
        if message is not None:
            await self._accept(message)

    async def _on_command(self, ack: Any, command: dict[str, Any]) -> None:
        channel = str(command.get("channel_id", ""))
        user = str(command.get("user_id", ""))
        refusal = self._refusal(channel, user)
        if refusal is not None:
            # the ack's text reaches only the person who typed the command
            await ack(f"opsbot: {refusal}")
            return
        await ack()  # first, always: Slack gives up on the command after 3 s
        message = IncomingMessage(
            platform=PLATFORM,
            event_id=f"command:{command.get('trigger_id') or command.get('response_url')}",
            channel=channel,
            user=user,
            text=str(command.get("text", "")).strip(),
            kind=MessageKind.COMMAND,
            thread_id=None,
            user_name=command.get("user_name"),
            team=command.get("team_id"),
            extra={"response_url": command.get("response_url"), "trigger_id": command.get("trigger_id")},
        )
        self._schedule(message)

    async def _on_feedback(self, ack: Any, body: dict[str, Any], action: dict[str, Any]) -> None:
        await ack()
        prefix, _, request_id = str(action.get("action_id", "")).partition(":")
        value = 1 if prefix == FEEDBACK_UP else -1
        user = (body.get("user") or {}).get("id")
        if request_id:
            await self.store.record_feedback(request_id, PLATFORM, user, value)
            logger.info("slack feedback: request_id=%s user=%s value=%d", request_id, user, value)

    def _is_own(self, event: Mapping[str, Any]) -> bool:
        if event.get("bot_id") and event.get("bot_id") == self.bot_id:
            return True
        return bool(self.bot_user_id) and event.get("user") == self.bot_user_id

    def _normalise(
        self, event: Mapping[str, Any], body: Mapping[str, Any], kind: MessageKind
    ) -> IncomingMessage | None:
        channel = str(event.get("channel", ""))
        ts = str(event.get("ts", ""))
        user = str(event.get("user", ""))
        if not channel or not ts or not user:
            return None
        text = str(event.get("text", ""))
        if self.bot_user_id:
            text = text.replace(f"<@{self.bot_user_id}>", "")
        text = text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&").strip()
        return IncomingMessage(
            platform=PLATFORM,
            # channel:ts is the same for app_mention and message events of one message and for
            # every retry of either; Slack's event_id differs between the two event types
            event_id=f"{channel}:{ts}",
            channel=channel,
            user=user,
            text=text,
            kind=kind,
            thread_id=str(event.get("thread_ts") or ts),
            message_id=ts,
            team=str(body.get("team_id") or event.get("team") or "") or None,
            extra={"slack_event_id": body.get("event_id")},
        )

    def _refusal(self, channel: str, user: str) -> str | None:
        allowed_channels = self.settings.allowed_channels
        allowed_users = self.settings.allowed_users
        # a DM (channel id D...) is the asker's own space: only the user list applies there
        if allowed_channels and channel not in allowed_channels and not channel.startswith("D"):
            return "I am not enabled in this channel (it is not in slack.allowed_channels); ask an admin."
        if allowed_users and user not in allowed_users:
            return "you are not on opsbot's list of allowed users (slack.allowed_users); ask an admin."
        return None

    async def _accept(self, message: IncomingMessage) -> None:
        refusal = self._refusal(message.channel, message.user)
        if refusal is None:
            self._schedule(message)
            return
        # refusals are de-duplicated like answers: four deliveries, one ephemeral message
        if await self.store.claim_event(PLATFORM, message.event_id):
            logger.info(
                "slack refused: event_id=%s channel=%s user=%s: %s",
                message.event_id,
                message.channel,
                message.user,
                refusal,
            )
            await self.send_notice(message, f"opsbot: {refusal}", ephemeral=True)

    def _schedule(self, message: IncomingMessage) -> None:
        task = asyncio.create_task(self._run(message), name=f"slack-{message.event_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, message: IncomingMessage) -> None:
        if self._handler is None:
            logger.error("slack message before start(): event_id=%s dropped", message.event_id)
            return
        try:
            await self._handler(message)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception(
                "slack handler failed: event_id=%s channel=%s thread=%s",
                message.event_id,
                message.channel,
                message.thread_id,
            )


def _retry_after(headers: Mapping[str, Any]) -> float:
    """Seconds from a ``Retry-After`` header (Slack sends whole seconds); 1 s when absent."""
    for key, value in headers.items():
        if key.lower() == "retry-after":
            raw = value[0] if isinstance(value, list | tuple) else value
            try:
                return max(0.0, float(str(raw)))
            except (TypeError, ValueError):
                return 1.0
    return 1.0
