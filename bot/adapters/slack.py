"""Slack: @-mentions, DMs, ``/rca`` and thread follow-ups, streamed into threads (slack-bolt async).

Both connection modes share one bolt ``AsyncApp``: Socket Mode (``AsyncSocketModeHandler``, the
websocket URL comes from ``apps.connections.open`` on ``settings.api_base_url``) or the HTTP Events
API (:meth:`SlackAdapter.http_routes`: one Request URL for events, slash commands and
interactivity, every request's v0 signature and timestamp verified here before bolt sees it).

Every delivery is acknowledged at once and its work scheduled as a task. ``event_id`` is
``channel:ts`` of the user's message, so the ``app_mention`` and ``message`` events Slack sends for
one mention, and every retry of either (``X-Slack-Retry-Num`` / Socket Mode ``retry_attempt``), claim
the same key in the store and only the first is answered.

Web API calls go through :meth:`SlackAdapter.call` under the one retry policy (:mod:`bot.retry`):
429s wait their ``Retry-After`` (and hold back every other call of that method to that channel
meanwhile), 5xx and connection errors back off with jitter, each retry counted in
``CHAT_API_RETRIES``; a call that fails for good raises a :class:`SlackCallError` of the matching
branch of :mod:`bot.errors`. New posts to a channel are paced by a shared
:class:`~bot.adapters.streaming.ChannelPacer`. Every accepted message is handed to the pipeline
(``submit``), which owns it until it is answered; access rules are :mod:`bot.access`'s.
"""

from __future__ import annotations

import asyncio
import logging
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

from bot.access import AccessPolicy
from bot.adapters.base import ChatAdapter, MessageSink, ReplyStream
from bot.adapters.slack_format import (
    FEEDBACK_DOWN,
    FEEDBACK_UP,
    answer_blocks,
    escape,
    fallback_text,
    markdown_to_mrkdwn,
)
from bot.adapters.streaming import ChannelPacer, StreamingReply
from bot.config import SlackSettings
from bot.errors import (
    PlatformError,
    PlatformRejected,
    PlatformThrottled,
    PlatformUnavailable,
    platform_branch,
)
from bot.logs import request_scope
from bot.metrics import CHAT_API_RETRIES, REPLIES_FAILED, count_chat_call
from bot.retry import RetriesExhausted, RetryBudget, retry_after_from_headers
from bot.types import FinalAnswer, IncomingMessage, MessageKind

if TYPE_CHECKING:
    from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler

    from bot.store import Store

logger = logging.getLogger(__name__)

PLATFORM = "slack"
SIGNATURE_MAX_AGE_S = 300
"""Slack's replay window: a request timestamp older (or newer) than this is refused."""
_QUOTE_LIMIT = 500


class SlackCallError(PlatformError):
    """A Web API call failed for good; its subclasses place it in :mod:`bot.errors`' tree."""

    def __init__(self, method: str, error: str, *, http_status: int | None = None) -> None:
        super().__init__(f"{method}: {error}")
        self.method = method
        self.error = error
        """Slack's error code (``not_in_channel``, ``ratelimited``, ...) or what went wrong."""
        self.http_status = http_status


class SlackRejected(SlackCallError, PlatformRejected):
    """Slack answered ``ok: false`` or a 4xx: the call itself is wrong (retrying cannot help)."""


class SlackThrottled(SlackCallError, PlatformThrottled):
    """Still rate limited after ``slack.retry.patience_s``."""


class SlackUnavailable(SlackCallError, PlatformUnavailable):
    """5xx or connection errors after ``slack.retry.max_retries`` retries."""


_SLACK_BRANCH: dict[type[PlatformError], type[SlackCallError]] = {
    PlatformRejected: SlackRejected,
    PlatformThrottled: SlackThrottled,
    PlatformUnavailable: SlackUnavailable,
}


def slack_error(
    method: str, error: str, *, http_status: int | None, exhausted: str | None = None
) -> SlackCallError:
    """The :class:`SlackCallError` of the right branch for a failed call."""
    cls = _SLACK_BRANCH[platform_branch(http_status=http_status, exhausted=exhausted)]
    return cls(method, error, http_status=http_status)


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
    access: AccessPolicy

    def __init__(self, settings: SlackSettings, store: Store) -> None:
        if settings.bot_token is None:
            raise ValueError("slack.bot_token is required")
        self.settings = settings
        self.store = store
        self.access = AccessPolicy(settings, PLATFORM)
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
        self._submit: MessageSink | None = None
        self._socket: AsyncSocketModeHandler | None = None
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

    async def start(self, submit: MessageSink) -> None:
        """Learn the bot's own ids (``auth.test``), then connect (Socket Mode) or await HTTP posts."""
        self._submit = submit
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
        """Stop taking messages (close the Socket Mode connection; HTTP events are refused with 503
        from now on); answers in flight can still post until :meth:`close`."""
        self._submit = None
        if self._socket is not None:
            await self._socket.close_async()  # type: ignore[no-untyped-call]
            self._socket = None

    # -- Web API --------------------------------------------------------------------------------
    async def call(
        self,
        method: str,
        params: Mapping[str, Any],
        *,
        channel: str | None = None,
        token: str | None = None,
    ) -> dict[str, Any]:
        """One Web API call under the retry policy (``slack.retry``, see :mod:`bot.retry`).

        ``token`` replaces the bot token (the app-level token for ``apps.connections.open``).
        Raises :class:`SlackCallError` (of the branch the failure belongs to) when Slack refuses the
        call or the policy gives up.
        """
        headers = {"Authorization": f"Bearer {token}"} if token else None
        budget = RetryBudget(self.settings.retry)
        while True:
            await self._gates.wait(method, channel)
            http_status: int | None = None
            wait: float | None = None
            try:
                resp = await self.client.api_call(method, json=dict(params), headers=headers)
                count_chat_call(PLATFORM, method, "ok")
                return dict(resp.data) if isinstance(resp.data, dict) else {}
            except SlackApiError as exc:
                http_status = exc.response.status_code
                data = exc.response.data
                error = str(data.get("error", "")) if isinstance(data, dict) else ""
                detail = error or f"HTTP {http_status}"
                if http_status != 429 and http_status < 500:
                    count_chat_call(PLATFORM, method, "rejected")
                    raise slack_error(method, detail, http_status=http_status) from exc
                reason = "ratelimited" if http_status == 429 else "server_error"
                count_chat_call(PLATFORM, method, reason)
                if http_status == 429:
                    wait = retry_after_from_headers(exc.response.headers)
                failure: Exception = exc
            except (aiohttp.ClientError, TimeoutError) as exc:
                reason, detail, failure = "connection", type(exc).__name__, exc
                count_chat_call(PLATFORM, method, reason)
            try:
                if reason == "ratelimited":
                    delay = budget.after_rate_limit(wait, detail)
                    self._gates.block(method, channel, delay)
                else:
                    delay = budget.after_failure(detail)
            except RetriesExhausted as gave_up:
                raise slack_error(
                    method, str(gave_up), http_status=http_status, exhausted=gave_up.reason
                ) from failure
            CHAT_API_RETRIES.labels(PLATFORM, method, reason).inc()
            logger.info(
                "slack %s retry %d in %.2f s: %s (channel=%s)", method, budget.attempt, delay, detail, channel
            )
            await asyncio.sleep(delay)

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
            logger.error("slack reply not started: channel=%s error=%s", message.channel, exc)
            raise
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
            self._hand_over(message)

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
            self._hand_over(message)

    async def _on_command(self, ack: Any, command: dict[str, Any]) -> None:
        channel = str(command.get("channel_id", ""))
        user = str(command.get("user_id", ""))
        direct = channel.startswith("D") or command.get("channel_name") == "directmessage"
        refusal = self.access.refusal(channel, user, direct=direct)
        if refusal is not None:
            # the ack's text reaches only the person who typed the command
            await ack(refusal.text)
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
            is_direct=direct,
            extra={"response_url": command.get("response_url"), "trigger_id": command.get("trigger_id")},
        )
        self._hand_over(message)

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
            is_direct=event.get("channel_type") == "im" or channel.startswith("D"),
            extra={"slack_event_id": body.get("event_id")},
        )

    def _hand_over(self, message: IncomingMessage) -> None:
        """Give an accepted message to the pipeline, which owns it from here (claim, access, answer)."""
        with request_scope(message.request_id):
            if self._submit is None:
                logger.warning(
                    "slack message arrived while stopping: event_id=%s not taken", message.event_id
                )
                return
            self._submit(message)
