"""Slack: @-mentions, DMs, ``/rca`` and thread follow-ups, streamed into threads (slack-bolt async).

Both connection modes share one bolt ``AsyncApp``: Socket Mode (:mod:`bot.adapters.slack_socket`:
a pool of pinged connections, the websocket URL from ``apps.connections.open``) or the HTTP Events
API (:meth:`SlackAdapter.http_routes`: one Request URL for events, slash commands and
interactivity, every request's v0 signature and timestamp verified here before bolt sees it).

Every delivery is acknowledged at once and its work scheduled as a task. ``event_id`` is
``channel:ts`` of the user's message, so the ``app_mention`` and ``message`` events Slack sends for
one mention, and every retry of either (``X-Slack-Retry-Num`` / Socket Mode ``retry_attempt``), claim
the same key in the store and only the first is answered. Messages written by bots (any event
with a ``bot_id``) are dropped unless allow-listed (:mod:`bot.access`).

The adapter has three rooms, like Mattermost's: this one (connections, events, commands, signs of
life, reading threads back), :mod:`bot.adapters.slack_api` (the Web API transport every call goes
through: rate budget, retries, the error tree) and :mod:`bot.adapters.slack_reply` (an answer's two
renderings: native streaming or post-and-edit). A workspace that answers the streaming methods are
unavailable is remembered here and gets post-and-edit from then on. The sign of life is a reaction
on the asking message (the thread status in assistant threads), swapped for a done / failed
reaction when the answer ends.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import urllib.parse
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.adapter.socket_mode.internals import build_headers
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.authorization import AuthorizeResult
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.signature import SignatureVerifier
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.web.async_client import AsyncWebClient

from bot.access import AccessPolicy, slack_author
from bot.actions.approval import Click
from bot.actions.cards import slack_blocks
from bot.adapters.base import ChatAdapter, Housekeeping, MessageSink, ReplyStream
from bot.adapters.ratelimit import (
    STALL_AFTER_S,
    BudgetTimeout,
    Priority,
    RateBudget,
    Ticket,
    prepaid,
    ticket,
)
from bot.adapters.slack_api import (
    PLATFORM,
    POST_EVENT_TYPE,
    SlackCallError,
    SlackRejected,
    SlackWebClient,
    call_policy,
    slack_error,
)
from bot.adapters.slack_format import (
    FEEDBACK_DOWN,
    FEEDBACK_UP,
    answer_blocks,
    escape,
    fallback_text,
    markdown_to_mrkdwn,
)
from bot.adapters.slack_reply import SIGN_OF_LIFE_KEY, STREAM_UNAVAILABLE, SlackReply
from bot.adapters.slack_socket import SocketModeConnections
from bot.config import RetrySettings, SlackSettings
from bot.errors import PlatformError, PlatformRejected, StartupError
from bot.http import accepts
from bot.metrics import REPLIES_FAILED
from bot.types import FinalAnswer, IncomingMessage, MessageKind, ThreadPost, ThreadRead

if TYPE_CHECKING:
    from bot.actions.cards import Card
    from bot.actions.service import ActionService
    from bot.store import Store

logger = logging.getLogger(__name__)

SIGNATURE_MAX_AGE_S = 300
"""Slack's replay window: a request timestamp older (or newer) than this is refused."""
_QUOTE_LIMIT = 500
UNKNOWN_USER_TTL_S = 3600.0
"""Seconds a user that ``users.info`` does not know stays unknown before it is looked up again."""
_THREAD_STATUS = "is looking into it…"
COMMAND_ACK_WAIT_S = 1.5
"""Longest wait in seconds for the pipeline's first word on a slash command before it is acked
without one (Slack drops an ack later than 3 s)."""
_ASSISTANT_THREADS_MAX = 10_000
_MAX_THREAD_PAGES = 50
"""Most ``conversations.replies`` calls for one thread (a runaway thread must not eat the rate tier)."""
_PERMALINK = re.compile(
    r"https?://[^\s/|>]+/archives/(?P<channel>[A-Z0-9]+)/p(?P<ts>\d{16})(?:\?[^\s|>]*?thread_ts=(?P<thread>\d+\.\d+))?"
)


def slack_time(ts: object) -> float | None:
    """A Slack message ``ts`` (``"1712345678.123456"``, the server's clock) in seconds since the
    epoch; ``None`` for none or a malformed one."""
    try:
        return float(str(ts))
    except ValueError:
        return None


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
        self.budget = RateBudget(
            settings.rate_limits,
            channel_limits={
                "chat.postMessage": (settings.channel_post_interval_s, settings.channel_post_burst)
            },
            enabled=settings.rate_budgets,
            name=PLATFORM,
            stall_after_s=STALL_AFTER_S,
        )
        self.client = SlackWebClient(
            token=settings.bot_token.get_secret_value(),
            base_url=settings.api_base_url,
            rate_budget=self.budget,
            retry=settings.retry,
        )
        self._verifier = (
            SignatureVerifier(settings.signing_secret.get_secret_value())
            if settings.signing_secret is not None
            else None
        )
        self._submit: MessageSink | None = None
        self._socket: SocketModeConnections | None = None
        self.bot_user_id: str | None = None
        self.bot_id: str | None = None
        self.team_id: str | None = None
        self.no_streaming: dict[str, str] = {}
        """Workspaces (team ids) that refused native streaming, with Slack's error code."""
        self._assistant_threads: OrderedDict[tuple[str, str], None] = OrderedDict()
        self.housekeeping = Housekeeping("slack")
        """Reaction swaps after answers (background, lowest priority)."""
        self._names: dict[str, str] = {}
        """Display names by user id (``users.info``), for threads read back."""
        self._unknown_users: dict[str, float] = {}
        """Users ``users.info`` does not know, until when (monotonic seconds) that is believed."""
        self._channel_names: dict[str, str | None] = {}
        self.actions: ActionService | None = None
        """Where Approve / Reject clicks go (``[actions]``; ``None``: actions are off)."""
        self.app = self._build_app()

    @property
    def socket(self) -> SocketModeConnections | None:
        """The Socket Mode connections (socket mode, after :meth:`start`)."""
        return self._socket

    # -- lifecycle --------------------------------------------------------------------------------
    def _build_app(self) -> AsyncApp:
        async def authorize(enterprise_id: str | None, team_id: str | None) -> AuthorizeResult:
            return await self._authorize(enterprise_id, team_id)

        app = AsyncApp(
            # bolt makes a client per request from this one's settings (base URL, timeout); its
            # token comes from `authorize`, which answers from the one auth.test start() made
            # (bolt's own authorization would call auth.test for every request of a first burst)
            client=AsyncWebClient(base_url=self.settings.api_base_url, timeout=self.client.timeout),
            authorize=authorize,
            # signatures are checked in `_http_endpoint` (so a refusal never logs the body)
            request_verification_enabled=False,
            signing_secret="unused",
            process_before_response=False,
            logger=logging.getLogger("bot.adapters.slack.bolt"),
        )
        app.event("app_mention")(self._on_app_mention)
        app.event("message")(self._on_message)
        app.event("assistant_thread_started")(self._on_assistant_thread)
        app.command(self.settings.command)(self._on_command)
        app.action(re.compile(rf"^({FEEDBACK_UP}|{FEEDBACK_DOWN}):"))(self._on_feedback)
        app.action(re.compile(r"^opsbot_action_(approve|reject)$"))(self._on_action_click)
        return app

    async def preflight(self) -> None:
        """``auth.test`` with the bot token, and in Socket Mode ``apps.connections.open`` with the
        app token (a connection URL that is never used: it expires unopened)."""
        self._open_session()
        checks: list[tuple[str, str, str | None]] = [("auth.test", "bot_token", None)]
        if self.settings.mode == "socket" and self.settings.app_token is not None:
            checks.append(("apps.connections.open", "app_token", self.settings.app_token.get_secret_value()))
        try:
            for method, key, token in checks:
                try:
                    await self.call(method, {}, token=token)
                except PlatformRejected as exc:
                    raise StartupError(
                        f"slack.{key} (OPSBOT_SLACK__{key.upper()}) was refused by Slack's {method} at "
                        f"{self.settings.api_base_url}: {getattr(exc, 'error', exc)}. Fix: copy the "
                        f"{'xoxb-' if key == 'bot_token' else 'xapp-'} token again from the app's settings "
                        "page (a reinstalled app has new tokens)"
                    ) from None
                except PlatformError as exc:
                    raise StartupError(
                        f"Slack cannot be reached at slack.api_base_url {self.settings.api_base_url}: "
                        f"{exc}. Fix: check the network or slack.api_base_url (OPSBOT_SLACK__API_BASE_URL)"
                    ) from None
        except BaseException:
            await self._close_session()
            raise

    def _open_session(self) -> None:
        if self.client.session is None or self.client.session.closed:
            # One pooled session for every Web API call: without it slack_sdk opens (and over
            # HTTPS handshakes) a new connection for each call, the largest share of a busy
            # bot's CPU. No connection cap: the rate budget is what limits calls.
            self.client.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=self.client.timeout),
            )

    async def start(self, submit: MessageSink) -> None:
        """Learn the bot's own ids (``auth.test``), then connect (Socket Mode) or await HTTP posts."""
        self._submit = submit
        self._open_session()
        try:
            await self._connect()
        except BaseException:  # a start that failed leaves no open connections behind
            await self._close_session()
            raise
        logger.info("slack connected: mode=%s bot_user=%s", self.settings.mode, self.bot_user_id)

    async def _connect(self) -> None:
        auth = await self.call("auth.test", {})
        self.bot_user_id = str(auth.get("user_id") or "") or None
        self.bot_id = str(auth.get("bot_id") or "") or None
        self.team_id = str(auth.get("team_id") or "") or None
        self.client.bot_id = self.bot_id
        if self.settings.mode == "socket":
            if self.settings.app_token is None:
                raise ValueError("slack.app_token (xapp-...) is required in socket mode")
            self._socket = SocketModeConnections(
                self.settings, open_url=self._socket_url, handle=self._dispatch_envelope
            )
            try:
                await self._socket.start()
            except BaseException:
                self._socket = None
                raise
        elif self._verifier is None:
            raise ValueError("slack.signing_secret is required in http mode")

    async def _close_session(self) -> None:
        if self.client.session is not None:
            await self.client.session.close()
            self.client.session = None

    async def _authorize(self, enterprise_id: str | None, team_id: str | None) -> AuthorizeResult:
        assert self.settings.bot_token is not None
        if self.bot_user_id is None:  # a request before start() finished
            auth = await self.call("auth.test", {})
            self.bot_user_id, self.bot_id = auth.get("user_id"), auth.get("bot_id")
            self.team_id = self.team_id or auth.get("team_id")
        return AuthorizeResult(
            enterprise_id=enterprise_id,
            team_id=team_id or self.team_id,
            bot_token=self.settings.bot_token.get_secret_value(),
            bot_id=self.bot_id,
            bot_user_id=self.bot_user_id,
        )

    async def _socket_url(self) -> str:
        assert self.settings.app_token is not None
        opened = await self.call(
            "apps.connections.open", {}, token=self.settings.app_token.get_secret_value()
        )
        return str(opened["url"])

    async def _dispatch_envelope(self, request: SocketModeRequest) -> dict[str, Any] | None:
        """One Socket Mode envelope through bolt; the acknowledgement to send (``None``: none)."""
        bolt_request = AsyncBoltRequest(
            mode="socket_mode", body=request.payload, headers=build_headers(request)
        )
        response = await self.app.async_dispatch(bolt_request)
        if response.status != 200:
            logger.info(
                "slack envelope %s not acknowledged (bolt status %d)", request.envelope_id, response.status
            )
            return None
        ack: dict[str, Any] = {"envelope_id": request.envelope_id}
        if response.body:
            content_type = (response.headers.get("content-type") or [""])[0]
            if content_type.startswith("application/json"):
                ack["payload"] = json.loads(response.body)
            else:
                ack["payload"] = {"text": response.body}
        return ack

    async def stop(self) -> None:
        """Stop taking messages (close the Socket Mode connections; HTTP events are refused with 503
        from now on); answers in flight can still post until :meth:`close`."""
        self._submit = None
        if self._socket is not None:
            await self._socket.close()
            self._socket = None

    # -- Web API --------------------------------------------------------------------------------
    async def call(
        self,
        method: str,
        params: Mapping[str, Any],
        *,
        channel: str | None = None,
        token: str | None = None,
        http_verb: str = "POST",
    ) -> dict[str, Any]:
        """One Web API call through the transport (rate budget, ``slack.retry``; see
        :class:`SlackWebClient`). ``token`` replaces the bot token (the app-level token for
        ``apps.connections.open``). Raises :class:`SlackCallError` (of the branch the failure
        belongs to) when Slack refuses the call or the policy gives up. ``http_verb="GET"``: the
        arguments go in the query (read methods such as ``conversations.replies`` take no JSON body)."""
        headers = {"Authorization": f"Bearer {token}"} if token else None
        if http_verb == "GET":
            resp = await self.client.api_call(method, http_verb="GET", params=dict(params), headers=headers)
        else:
            resp = await self.client.api_call(method, json=dict(params), headers=headers)
        return dict(resp.data) if isinstance(resp.data, dict) else {}

    def post_tag(self, request_id: str) -> dict[str, Any]:
        """Message metadata for one new post: request id and a key unique to the post."""
        return {
            "event_type": POST_EVENT_TYPE,
            "event_payload": {"request_id": request_id, "post_key": uuid.uuid4().hex},
        }

    async def post_piece(
        self, channel: str, thread_ts: str | None, mrkdwn: str, final: FinalAnswer | None, request_id: str
    ) -> str:
        """Post one message of an answer (``final``: the last, with footer and buttons); its ``ts``."""
        params: dict[str, Any] = {
            "channel": channel,
            "text": fallback_text(mrkdwn),
            "unfurl_links": False,
            "unfurl_media": False,
            "metadata": self.post_tag(request_id),
        }
        if thread_ts:
            params["thread_ts"] = thread_ts
        if final is not None:
            params["blocks"] = answer_blocks(mrkdwn, final)
        data = await self.call("chat.postMessage", params, channel=channel)
        return str(data["ts"])

    async def _post(self, params: dict[str, Any], request_id: str) -> dict[str, Any]:
        params = {**params, "metadata": self.post_tag(request_id)}
        return await self.call("chat.postMessage", params, channel=str(params["channel"]))

    async def _quick(
        self,
        method: str,
        params: dict[str, Any],
        priority: Priority,
        wait_s: float,
        *,
        accept: tuple[str, ...] = (),
    ) -> bool:
        """A best-effort call that must never hold an answer up: at most ``wait_s`` for its budget
        slot and its 429s, one retry; ``True`` when it took effect (``accept``: codes that mean so)."""
        channel = str(params.get("channel") or params.get("channel_id") or "")
        policy = RetrySettings(max_retries=1, initial_s=0.2, max_s=1.0, patience_s=max(wait_s, 0.01))
        try:
            permit = await self.budget.acquire(method, channel, ticket=Ticket(priority), max_wait_s=wait_s)
        except BudgetTimeout:
            logger.info("slack %s skipped: its budget had no slot within %.1f s", method, wait_s)
            return False
        try:
            with prepaid(permit), call_policy(policy):
                await asyncio.wait_for(self.call(method, params), wait_s + 5.0)
            return True
        except SlackCallError as exc:
            if exc.error in accept:
                return True
            logger.info("slack %s failed: %s", method, exc)
        except TimeoutError:
            logger.info("slack %s took too long; given up", method)
        finally:
            permit.release()
        return False

    # -- native streaming ------------------------------------------------------------------------
    def may_stream_natively(self, message: IncomingMessage) -> bool:
        """Whether ``message``'s answer may try ``chat.startStream`` (settings, workspace, asker)."""
        if self.settings.streaming == "edit" or message.kind is MessageKind.ALERT:
            return False
        if (message.team or self.team_id or "") in self.no_streaming:
            return False
        return bool(message.user) and message.user[:1] in ("U", "W")

    def streaming_refused(self, message: IncomingMessage, exc: SlackCallError) -> None:
        """Slack refused ``chat.startStream``: remember a workspace-wide refusal, log the rest."""
        team = message.team or self.team_id or ""
        if exc.error in STREAM_UNAVAILABLE:
            self.no_streaming[team] = exc.error
            logger.warning(
                "slack workspace %s cannot stream natively (%s): post-and-edit from now on", team, exc.error
            )
        else:
            logger.info(
                "slack native stream refused in %s (%s): post-and-edit for this answer", message.channel, exc
            )

    # -- sign of life ------------------------------------------------------------------------------
    async def acknowledge(self, message: IncomingMessage) -> None:
        """A reaction on the asking message (the thread status in an assistant thread), at once."""
        if message.kind in (MessageKind.COMMAND, MessageKind.ALERT) or not message.message_id:
            return
        s = self.settings
        if (message.channel, message.thread_id or "") in self._assistant_threads:
            params = {"channel_id": message.channel, "thread_ts": message.thread_id, "status": _THREAD_STATUS}
            if await self._quick("assistant.threads.setStatus", params, Priority.ACK, s.ack_wait_s):
                message.extra[SIGN_OF_LIFE_KEY] = "status"
        elif s.ack_reaction:
            # Reactions have a small tier: once it is spoken for, an ephemeral note (a larger tier,
            # and no channel post) is the sign of life instead of a wait nobody sees.
            spent = self.budget.spare("reactions.add") < 1
            if spent and s.ack_fallback_text and await self._ephemeral_ack(message):
                return
            params = {"channel": message.channel, "name": s.ack_reaction, "timestamp": message.message_id}
            if await self._quick(
                "reactions.add", params, Priority.ACK, s.ack_wait_s, accept=("already_reacted",)
            ):
                message.extra[SIGN_OF_LIFE_KEY] = "reaction"

    async def _ephemeral_ack(self, message: IncomingMessage) -> bool:
        params: dict[str, Any] = {
            "channel": message.channel,
            "user": message.user,
            "text": self.settings.ack_fallback_text,
        }
        if message.thread_id and message.thread_id != message.message_id:
            params["thread_ts"] = message.thread_id
        if await self._quick("chat.postEphemeral", params, Priority.ACK, self.settings.ack_wait_s):
            message.extra[SIGN_OF_LIFE_KEY] = "ephemeral"  # nothing to swap later: it fades by itself
            return True
        return False

    async def conclude(self, message: IncomingMessage, *, ok: bool) -> None:
        """Swap the sign of life for the done / failed reaction (or clear the thread status), in
        the background at the lowest priority: Slack's reaction tiers are small, signs of life
        for new questions go first, and the answer is already there."""
        sign = message.extra.get(SIGN_OF_LIFE_KEY)
        if sign is None or sign == "ephemeral":
            return
        s = self.settings
        if sign == "status":
            params = {"channel_id": message.channel, "thread_ts": message.thread_id, "status": ""}
            self.housekeeping.add(lambda: self._background("assistant.threads.setStatus", params))
            return
        target = {"channel": message.channel, "timestamp": message.message_id}
        mark = s.done_reaction if ok else s.failed_reaction

        async def swap() -> None:
            await self._background("reactions.remove", {**target, "name": s.ack_reaction}, ("no_reaction",))
            if mark:
                await self._background("reactions.add", {**target, "name": mark}, ("already_reacted",))

        self.housekeeping.add(swap)

    async def _background(self, method: str, params: dict[str, Any], accept: tuple[str, ...] = ()) -> None:
        with ticket(Priority.BACKGROUND):
            try:
                await self.call(method, params)
            except SlackCallError as exc:
                if exc.error not in accept:
                    logger.info("slack %s failed: %s", method, exc)

    async def close(self) -> None:
        """Drop the reaction swaps not done yet (after the pipeline drained); close the connections."""
        await self.housekeeping.close()
        await self._close_session()

    # -- ChatAdapter ---------------------------------------------------------------------------
    async def open_reply(self, message: IncomingMessage) -> ReplyStream:
        """The answer's stream in the message's thread; ``/rca`` first gets a channel message to
        thread under."""
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
                with ticket(Priority.ACK):
                    data = await self._post({"channel": message.channel, "text": text}, message.request_id)
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
        """Ephemeral: only the asker sees it (a slash command's ack when it can still carry it, else
        ``chat.postEphemeral``); else a post in the thread."""
        body = markdown_to_mrkdwn(text)
        if ephemeral and message.settle_first_word(body):
            return
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
                await self._post(params, message.request_id)
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
        data = await self._post(params, "alert")
        return str(data["ts"])

    # -- HTTP mode -----------------------------------------------------------------------------
    def http_routes(self) -> list[web.RouteDef]:
        """``POST settings.events_path``: events, slash commands and interactivity (one Request URL)."""
        if self.settings.mode != "http":
            return []
        return [web.post(self.settings.events_path, self._http_endpoint)]

    @accepts("application/json", "application/x-www-form-urlencoded")  # events | commands, actions
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
        malformed = malformed_slack_body(body, request.content_type)
        if malformed is not None:
            logger.warning("slack request refused (400): %s; path=%s", malformed, request.path)
            return web.json_response({"error": f"malformed Slack request: {malformed}"}, status=400)
        headers: dict[str, str | Sequence[str]] = {k.lower(): v for k, v in request.headers.items()}
        try:
            bolt_request = AsyncBoltRequest(
                body=body.decode("utf-8"), query=request.query_string, headers=headers
            )
            bolt_response = await self.app.async_dispatch(bolt_request)
        except (TypeError, AttributeError, KeyError, IndexError, ValueError) as exc:
            # bolt read a field of a shape malformed_slack_body does not know: refuse, never a 500
            logger.warning(
                "slack request could not be parsed (400): %s: %s; path=%s",
                type(exc).__name__,
                exc,
                request.path,
            )
            return web.json_response({"error": "malformed Slack request"}, status=400)
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
        try:
            valid = self._verifier.is_valid(body, timestamp, signature)
        except UnicodeDecodeError:  # the verifier decodes the body; Slack only ever sends UTF-8
            valid = False
        if not valid:
            return "bad signature"
        return None

    # -- inbound ------------------------------------------------------------------------------
    async def _on_app_mention(self, event: dict[str, Any], body: dict[str, Any]) -> None:
        if self._ignored(event):
            return
        message = self._normalise(event, body, MessageKind.MENTION)
        if message is not None:
            self._hand_over(message)

    async def _on_message(self, event: dict[str, Any], body: dict[str, Any]) -> None:
        # every subtype is skipped (edits, deletions, joins, ...) but bot_message, which the bot
        # policy decides: an allow-listed integration is answered like a person
        subtype = event.get("subtype")
        if (subtype and subtype != "bot_message") or self._ignored(event):
            return
        if not (event.get("user") or event.get("bot_id")):
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
            and await self.store.is_bot_thread(PLATFORM, channel, str(thread_ts), slack_time(ts))
        ):
            kind = MessageKind.FOLLOWUP
        else:
            return
        message = self._normalise(event, body, kind)
        if message is not None:
            self._hand_over(message)

    async def _on_command(self, ack: Any, command: dict[str, Any]) -> None:
        channel = str(command.get("channel_id", ""))
        direct = channel.startswith("D") or command.get("channel_name") == "directmessage"
        message = IncomingMessage(
            platform=PLATFORM,
            event_id=f"command:{command.get('trigger_id') or command.get('response_url')}",
            channel=channel,
            user=str(command.get("user_id", "")),
            text=str(command.get("text", "")).strip(),
            kind=MessageKind.COMMAND,
            thread_id=None,
            user_name=command.get("user_name"),
            team=command.get("team_id"),
            is_direct=direct,
            extra={"response_url": command.get("response_url"), "trigger_id": command.get("trigger_id")},
            first_word=asyncio.get_running_loop().create_future(),
        )
        self._hand_over(message)
        # The pipeline decides (access, command words): a refusal, help or status rides on the ack,
        # whose text only the person who typed the command sees; Slack gives up after 3 s.
        text = await message.wait_first_word(COMMAND_ACK_WAIT_S)
        await (ack(text) if text is not None else ack())

    async def _on_feedback(self, ack: Any, body: dict[str, Any], action: dict[str, Any]) -> None:
        await ack()
        prefix, _, request_id = str(action.get("action_id", "")).partition(":")
        value = 1 if prefix == FEEDBACK_UP else -1
        user = (body.get("user") or {}).get("id")
        if request_id:
            await self.store.record_feedback(request_id, PLATFORM, user, value)
            logger.info("slack feedback: request_id=%s user=%s value=%d", request_id, user, value)

    async def _on_action_click(self, ack: Any, body: dict[str, Any], action: dict[str, Any]) -> None:
        # The clicker is whoever Slack says clicked: the request's v0 signature (HTTP mode) or the
        # app-token-authenticated Socket Mode link vouches for the whole payload, user.id included.
        await ack()
        user = str((body.get("user") or {}).get("id", ""))
        channel = str(
            (body.get("channel") or {}).get("id", "") or (body.get("container") or {}).get("channel_id", "")
        )
        if not user or not channel:
            return
        if self.actions is None:
            text = ":no_entry: Actions are turned off here; nothing was done."
        else:
            name = (body.get("user") or {}).get("username")
            click = Click(PLATFORM, str(action.get("value", "")), user, channel, str(name) if name else None)
            text = await self.actions.decide(click)
        params: dict[str, Any] = {"channel": channel, "user": user, "text": text}
        thread = (body.get("message") or {}).get("thread_ts")
        if thread:
            params["thread_ts"] = thread
        try:
            await self.call("chat.postEphemeral", params, channel=channel)
        except SlackCallError as exc:
            logger.warning("slack action answer not delivered to %s: %s", user, exc)

    async def post_card(self, channel: str, thread_id: str | None, card: Card) -> str:
        """Post a proposal card (Block Kit) into ``thread_id``'s thread; its ``ts``."""
        params: dict[str, Any] = {
            "channel": channel,
            "text": fallback_text(markdown_to_mrkdwn(card.title)),
            "blocks": slack_blocks(card),
        }
        if thread_id:
            params["thread_ts"] = thread_id
        data = await self.call("chat.postMessage", params, channel=channel)
        return str(data["ts"])

    async def update_card(self, channel: str, card_id: str, card: Card) -> None:
        """Replace a posted card (``chat.update``): decided, its buttons gone."""
        params = {"channel": channel, "ts": card_id, "text": card.title, "blocks": slack_blocks(card)}
        await self.call("chat.update", params, channel=channel)

    async def _on_assistant_thread(self, event: dict[str, Any]) -> None:
        thread = event.get("assistant_thread") or {}
        key = (str(thread.get("channel_id", "")), str(thread.get("thread_ts", "")))
        if all(key):
            self._assistant_threads[key] = None
            while len(self._assistant_threads) > _ASSISTANT_THREADS_MAX:
                self._assistant_threads.popitem(last=False)

    def _ignored(self, event: Mapping[str, Any]) -> bool:
        """Our own messages, and bots' that ``allowed_bots`` does not name (:mod:`bot.access`)."""
        if self._is_own(event):
            return True
        author = slack_author(event)
        if self.access.ignores_bot(author):
            logger.debug(
                "slack: ignored a %s message from %s in %s",
                author.form,
                "/".join(author.ids + author.names),
                event.get("channel"),
            )
            return True
        return False

    def _is_own(self, event: Mapping[str, Any]) -> bool:
        if event.get("bot_id") and event.get("bot_id") == self.bot_id:
            return True
        return bool(self.bot_user_id) and event.get("user") == self.bot_user_id

    def _normalise(
        self, event: Mapping[str, Any], body: Mapping[str, Any], kind: MessageKind
    ) -> IncomingMessage | None:
        channel = str(event.get("channel", ""))
        ts = str(event.get("ts", ""))
        user = str(event.get("user") or event.get("bot_id") or "")
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
            posted_at=slack_time(ts),
            team=str(body.get("team_id") or event.get("team") or "") or None,
            is_direct=event.get("channel_type") == "im" or channel.startswith("D"),
            extra={"slack_event_id": body.get("event_id")},
        )

    # -- threads and files (the thread as context, postmortem drafts) ----------------------------
    async def read_thread(
        self, channel: str, thread_id: str, *, limit: int, page_size: int = 200
    ) -> ThreadRead:
        """``conversations.replies`` cursor page by page (oldest first, as Slack pages), the newest
        ``limit`` messages kept; authors' names from ``users.info`` (cached)."""
        raw: dict[str, Mapping[str, Any]] = {}
        cursor = ""
        calls = 0
        while True:
            params: dict[str, Any] = {"channel": channel, "ts": thread_id, "limit": page_size}
            if cursor:
                params["cursor"] = cursor
            data = await self.call("conversations.replies", params, channel=channel, http_verb="GET")
            calls += 1
            for item in data.get("messages") or []:
                if isinstance(item, Mapping) and item.get("ts"):
                    raw.setdefault(str(item["ts"]), item)  # a page may repeat the parent
            cursor = str((data.get("response_metadata") or {}).get("next_cursor") or "")
            if not data.get("has_more") or not cursor:
                break
            if calls >= _MAX_THREAD_PAGES:
                logger.warning("slack thread %s/%s: stopped after %d pages", channel, thread_id, calls)
                break
        ordered = sorted(raw.values(), key=lambda m: float(str(m["ts"])))
        skipped = max(0, len(ordered) - limit) or (-1 if cursor else 0)
        kept = ordered[-limit:]
        names = await self._user_names(
            {str(m["user"]) for m in kept if m.get("user") and not m.get("bot_id")}
        )
        return ThreadRead([self._thread_post(m, names) for m in kept], skipped=skipped, calls=calls)

    def _thread_post(self, item: Mapping[str, Any], names: Mapping[str, str]) -> ThreadPost:
        own = self._is_own(item)
        author = slack_author(item)  # the bot policy's own reading of who wrote it
        user = str(item.get("user") or item.get("bot_id") or "")
        text = str(item.get("text") or "")
        if self.bot_user_id:
            text = text.replace(f"<@{self.bot_user_id}>", "@opsbot")
        text = text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
        for file in item.get("files") or []:
            if isinstance(file, Mapping):
                text += f" [shared file: {file.get('name') or file.get('title') or file.get('id')}]"
        is_bot = author.is_bot and not own
        return ThreadPost(
            message_id=str(item["ts"]),
            user=user,
            text=text,
            posted_at=datetime.fromtimestamp(float(str(item["ts"])), UTC),
            user_name=names.get(user) or next(iter(author.names), None),
            from_self=own,
            is_bot=is_bot,
            bot_ids=author.ids if is_bot else (),
            bot_names=author.names if is_bot else (),
        )

    async def _user_names(self, users: set[str]) -> dict[str, str]:
        """Display names of ``users`` (``users.info``, remembered); an unknown user keeps its id.

        A user Slack does not know (``user_not_found``: a Slack Connect guest, a deleted account)
        is remembered as unknown for ``UNKNOWN_USER_TTL_S``: every follow-up in that thread would
        otherwise ask again."""
        now = time.monotonic()
        missing = [u for u in users if u not in self._names and self._unknown_users.get(u, 0.0) <= now]

        async def look_up(user: str) -> None:
            try:
                data = await self.call("users.info", {"user": user}, http_verb="GET")
            except SlackCallError as exc:
                logger.info("slack users.info %s: %s", user, exc)
                if isinstance(exc, SlackRejected):  # an answer about the user, not a failed call
                    now = time.monotonic()
                    if len(self._unknown_users) >= 10_000:  # forget the expired ones first
                        self._unknown_users = {u: t for u, t in self._unknown_users.items() if t > now}
                    self._unknown_users[user] = now + UNKNOWN_USER_TTL_S
                return
            info = data.get("user") or {}
            profile = info.get("profile") or {}
            name = profile.get("display_name") or profile.get("real_name") or info.get("name")
            if name:
                self._names[user] = str(name)

        await asyncio.gather(*(look_up(u) for u in missing))
        return {u: self._names[u] for u in users if u in self._names}

    async def channel_name(self, channel: str) -> str | None:
        """The channel's name (``conversations.info``), remembered; ``None`` when Slack will not say."""
        if channel not in self._channel_names:
            try:
                data = await self.call("conversations.info", {"channel": channel}, http_verb="GET")
            except SlackCallError as exc:
                logger.info("slack conversations.info %s: %s", channel, exc)
                return None
            self._channel_names[channel] = str((data.get("channel") or {}).get("name") or "") or None
        return self._channel_names[channel]

    async def thread_from_link(self, text: str, channel: str) -> str | None:
        """The thread of a Slack permalink to a message of ``channel`` (``/rca summary <link>``):
        ``.../archives/<channel>/p<ts>`` (its ``thread_ts`` when the link is to a reply)."""
        for found in _PERMALINK.finditer(text):
            if found.group("channel") != channel:
                continue
            if found.group("thread"):
                return found.group("thread")
            digits = found.group("ts")
            return f"{digits[:-6]}.{digits[-6:]}"
        return None

    async def upload_file(
        self, channel: str, thread_id: str, *, filename: str, content: bytes, title: str, comment: str
    ) -> str:
        """``files.uploadV2``'s three steps, as slack-sdk's ``files_upload_v2`` takes them:
        ``files.getUploadURLExternal``, the bytes POSTed to the returned URL, then
        ``files.completeUploadExternal`` sharing the file in the thread with ``comment``."""
        issued = await self.call(
            "files.getUploadURLExternal", {"filename": filename, "length": len(content)}, channel=channel
        )
        file_id, upload_url = str(issued.get("file_id") or ""), str(issued.get("upload_url") or "")
        if not file_id or not upload_url:
            raise slack_error("files.getUploadURLExternal", "no upload_url in the answer", http_status=200)
        try:
            timeout = aiohttp.ClientTimeout(total=60)
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.post(upload_url, data=content) as resp,
            ):
                answer = (await resp.text())[:200]
                if resp.status != 200:
                    raise slack_error("file upload", f"HTTP {resp.status} {answer}", http_status=resp.status)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise slack_error("file upload", f"{type(exc).__name__}: {exc}", http_status=None) from exc
        await self.call(
            "files.completeUploadExternal",
            {
                "files": [{"id": file_id, "title": title}],
                "channel_id": channel,
                "thread_ts": thread_id,
                "initial_comment": markdown_to_mrkdwn(comment),
            },
            channel=channel,
        )
        return file_id

    def _hand_over(self, message: IncomingMessage) -> None:
        """Give an accepted message to the pipeline, which owns it from here (claim, access, answer)."""
        if self._submit is None:
            logger.warning(
                "slack message arrived while stopping: event_id=%s not taken",
                message.event_id,
                extra={"request_id": message.request_id},
            )
            return
        self._submit(message)  # the pipeline sets the request's id for everything it does


# Fields of a Slack payload (and of its event, message, item, view, ...) that bolt and this adapter
# read as text, and those that are text or an object ("user": "U1" or {"id": "U1", ...}).
_TEXT_FIELDS = (
    "type",
    "subtype",
    "text",
    "ts",
    "thread_ts",
    "event_ts",
    "channel_type",
    "bot_id",
    "team_id",
    "user_id",
    "channel_id",
    "enterprise_id",
    "user_team",
    "api_app_id",
    "event_id",
    "command",
    "response_url",
    "trigger_id",
    "challenge",
    "token",
    "action_id",
    "value",
    "callback_id",
)
_TEXT_OR_OBJECT = ("user", "team", "channel", "enterprise")
_OBJECTS = (
    "event",
    "message",
    "previous_message",
    "item",
    "assistant_thread",
    "view",
    "container",
    "bot_profile",
)
_LISTS_OF_OBJECTS = ("authorizations", "actions", "blocks", "files", "attachments")


def malformed_slack_body(body: bytes, content_type: str) -> str | None:
    """Why a (signed) body is not a Slack request of the shape Slack documents; ``None`` if it is.

    Events come as a JSON object, slash commands as a form, interactions as a form whose
    ``payload`` is a JSON object. Checked before bolt parses it: bolt assumes Slack's shapes and
    fails with a TypeError (a 500) on anything else.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return "body is not UTF-8"
    data: object
    if content_type == "application/json":
        try:
            data = json.loads(text)
        except ValueError:
            return "body is not JSON"
    else:
        form = urllib.parse.parse_qs(text, keep_blank_values=True)
        if "payload" not in form:
            return None if all(len(v) == 1 for v in form.values()) else "a form field is repeated"
        try:
            data = json.loads(form["payload"][0])
        except ValueError:
            return "payload is not JSON"
    return _shape_problem(data, "body", depth=0)


def _shape_problem(data: object, where: str, depth: int) -> str | None:
    if not isinstance(data, dict):
        return f"{where} is not a JSON object"
    for key in _TEXT_FIELDS:
        if data.get(key) is not None and not isinstance(data[key], str):
            return f"{where}.{key} is not a string"
    for key in _TEXT_OR_OBJECT:
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            problem = _shape_problem(value, f"{where}.{key}", depth + 1) if depth < 3 else None
            if problem:
                return problem
    for key in _OBJECTS:
        if data.get(key) is not None and depth < 3:
            problem = _shape_problem(data[key], f"{where}.{key}", depth + 1)
            if problem:
                return problem
    for key in _LISTS_OF_OBJECTS:
        value = data.get(key)
        if value is None:
            continue
        if not isinstance(value, list):
            return f"{where}.{key} is not a list"
        # items only need to be objects: a button action's "text" is itself an object, for one
        if not all(isinstance(item, dict) for item in value):
            return f"{where}.{key} holds something that is not an object"
    return None
