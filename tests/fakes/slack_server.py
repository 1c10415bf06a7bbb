"""A fake Slack that speaks the real wire protocol, for the real slack-sdk / slack-bolt clients.

Web API (``POST /api/<method>``): ``auth.test``, ``apps.connections.open``, ``chat.postMessage``
(with message ``metadata``), ``chat.update``, ``chat.postEphemeral``, ``chat.startStream`` /
``chat.appendStream`` / ``chat.stopStream`` (markdown and ``task_update`` / ``plan_update`` chunks,
the recipient rules of channels, the streaming state), ``reactions.add`` / ``reactions.remove``,
``assistant.threads.setStatus``, ``conversations.replies`` / ``conversations.history`` (metadata
with ``include_all_metadata``, ``oldest``; ``conversations.replies`` in cursor pages: ``limit``,
``cursor``, ``has_more``, ``response_metadata.next_cursor``), ``conversations.info``,
``users.info``, ``files.getUploadURLExternal`` + the upload URL (``POST /upload/v1/<id>``) +
``files.completeUploadExternal`` (the three steps of slack-sdk's ``files_upload_v2``), with
Slack's JSON envelopes (``{"ok": true, ...}`` / ``{"ok": false, "error": "..."}``) and error codes.

Rate limits as Slack publishes them (:data:`TIERS`): a token bucket per method per app and one per
channel for ``chat.postMessage``; an empty bucket answers ``429`` + ``Retry-After`` (error
``ratelimited``), and every call that arrives while a method's ``Retry-After`` still runs is marked
(:attr:`ApiCall.inside_retry_after`). Faults are chosen per request by :class:`FaultRule` s the test
sets: ``429`` + ``Retry-After`` (``ratelimited``), ``500`` with an HTML body, or a dropped
connection. Every call is recorded with the fake's own monotonic timestamp (:attr:`FakeSlack.calls`).

Socket Mode: ``apps.connections.open`` returns a ``ws://`` URL on this server; the websocket sends
``hello``, delivers envelopes (``events_api``, ``slash_commands``, ``interactive``), records acks by
``envelope_id`` and redelivers unacked envelopes (``retry_attempt`` / ``retry_reason``) when their
connection drops or after ``redeliver_after_s``. :meth:`FakeSlack.disconnect` sends
``{"type": "disconnect", "reason": "refresh_requested"}`` and can drop the socket;
:meth:`FakeSlack.stall` makes the open connections half-open (nothing is sent or read on them, pings
go unanswered, and the server keeps routing envelopes into them until :meth:`FakeSlack.unstall`).
At most 10 connections per app (``too_many_websockets`` beyond).

HTTP mode: :meth:`FakeSlack.post_to_app` signs (v0 scheme) and POSTs events, slash commands and
interactions to the app's URL, with ``X-Slack-Retry-Num`` / ``X-Slack-Retry-Reason`` when asked.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import itertools
import json
import math
import random
import re
import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

CHAT_METHODS = frozenset({"chat.postMessage", "chat.update", "chat.postEphemeral"})
STREAM_METHODS = frozenset({"chat.startStream", "chat.appendStream", "chat.stopStream"})

TIERS: dict[str, tuple[float, int]] = {
    # method: (most calls in any 60 s window, calls allowed at once), per app per workspace, from
    # Slack's method reference (Tier 2: 20+ per minute, Tier 3: 50+, Tier 4: 100+)
    "chat.update": (50, 10),
    "chat.appendStream": (100, 20),
    "chat.startStream": (20, 5),
    "chat.stopStream": (20, 5),
    "chat.postEphemeral": (100, 40),
    "chat.postMessage": (300, 30),
    "reactions.add": (50, 40),
    "reactions.remove": (20, 10),
    "conversations.replies": (50, 10),
    "conversations.history": (50, 10),
    "assistant.threads.setStatus": (100, 40),
    "apps.connections.open": (50, 10),
    "conversations.info": (50, 10),
    "users.info": (100, 40),
    "files.getUploadURLExternal": (100, 20),
    "files.completeUploadExternal": (100, 20),
}
"""The published tiers the fake enforces (the burst is the share of the minute allowed at once)."""
CHANNEL_POST: tuple[float, int] = (1.0, 3)
"""``chat.postMessage`` per channel: one per second, short bursts allowed."""
MAX_SOCKETS = 10
"""Socket Mode connections one app may hold."""
_REACTION_NAME = re.compile(r"^[a-z0-9_+'-]+$")
_CHUNK_STATUSES = {"pending", "in_progress", "complete", "error"}


class TokenBucket:
    """The server's bucket: ``burst`` tokens, refilled so no 60 s window exceeds ``per_minute``."""

    def __init__(self, per_minute: float, burst: int, refill_s: float | None = None) -> None:
        self.capacity = float(burst)
        self.refill_s = refill_s if refill_s is not None else 60.0 / (per_minute - burst)
        self.tokens = float(burst)
        self.at: float | None = None

    def take(self, now: float) -> float:
        """Take a token (0.0) or say how many seconds until one is there (nothing taken)."""
        if self.at is not None:
            self.tokens = min(self.capacity, self.tokens + (now - self.at) / self.refill_s)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) * self.refill_s


@dataclass
class FaultRule:
    """Per-request fault injection: each matching call draws once from the probabilities.

    ``methods``: Web API methods it applies to (``None``: all but auth/connection methods).
    ``times``: stop after injecting this many faults (``None``: no limit).
    ``after``: a ``server_error`` / ``dropped`` fault comes after the call took effect (the message
    is stored, the client cannot know: what a retried post must not post twice).
    """

    methods: frozenset[str] | None = CHAT_METHODS
    ratelimited: float = 0.0
    server_error: float = 0.0
    dropped: float = 0.0
    retry_after_s: int = 1
    times: int | None = None
    after: bool = False
    seed: int = 0
    injected: int = 0
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def draw(self, method: str) -> str | None:
        if self.methods is None:
            if method in ("auth.test", "apps.connections.open"):
                return None
        elif method not in self.methods:
            return None
        if self.times is not None and self.injected >= self.times:
            return None
        r = self._rng.random()
        fault: str | None = None
        if r < self.ratelimited:
            fault = "ratelimited"
        elif r < self.ratelimited + self.server_error:
            fault = "server_error"
        elif r < self.ratelimited + self.server_error + self.dropped:
            fault = "dropped"
        if fault is not None:
            self.injected += 1
        return fault


@dataclass
class ApiCall:
    """One Web API request as the fake saw it."""

    method: str
    params: dict[str, Any]
    at: float
    """Fake's monotonic clock when the request arrived."""
    status: int = 200
    ok: bool = True
    error: str | None = None
    fault: str | None = None
    """``ratelimited`` / ``server_error`` / ``dropped`` (a :class:`FaultRule`), or ``tier`` (a 429
    from the published rate limits)."""
    retry_after_s: int | None = None
    inside_retry_after: bool = False
    """The call arrived while a ``Retry-After`` the fake gave for its method was still running."""
    window_from: float | None = None
    """When that ``Retry-After`` window began (the arrival of the call answered 429)."""

    @property
    def channel(self) -> str | None:
        value = self.params.get("channel") or self.params.get("channel_id")
        return str(value) if value is not None else None


@dataclass
class FakeMessage:
    """A message in the fake workspace (posted by a user or by the bot)."""

    channel: str
    ts: str
    text: str
    user: str
    thread_ts: str | None = None
    blocks: list[dict[str, Any]] | None = None
    bot_id: str | None = None
    posted_at: float = 0.0
    edits: list[tuple[float, str, list[dict[str, Any]] | None]] = field(default_factory=list)
    """``(fake clock, text, blocks)`` of every accepted ``chat.update``."""
    metadata: dict[str, Any] | None = None
    streaming: bool = False
    """Started by ``chat.startStream`` and not stopped yet."""
    streamed: bool = False
    """Made by ``chat.startStream`` (a natively streamed message)."""
    chunks: list[dict[str, Any]] = field(default_factory=list)
    """Task and plan chunks a stream received, in order."""
    appends: list[tuple[float, str]] = field(default_factory=list)
    """``(fake clock, markdown)`` of every accepted ``chat.appendStream``."""
    reactions: dict[str, list[str]] = field(default_factory=dict)
    """Reaction name -> users who reacted."""
    reaction_log: list[tuple[float, str, str]] = field(default_factory=list)
    """``(fake clock, "add" | "remove", name)`` of the bot's reaction calls that took effect."""
    subtype: str | None = None
    """``bot_message`` for an integration's or workflow's message."""
    username: str | None = None
    """The name a ``bot_message`` is posted under."""
    files: list[dict[str, Any]] | None = None
    """Files shared with this message (``files.completeUploadExternal``)."""

    def to_api(self, *, metadata: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "message", "ts": self.ts, "text": self.text, "user": self.user}
        if self.thread_ts:
            out["thread_ts"] = self.thread_ts
        if self.bot_id:
            out["bot_id"] = self.bot_id
        if self.blocks is not None:
            out["blocks"] = self.blocks
        if self.reactions:
            out["reactions"] = [
                {"name": n, "users": list(u), "count": len(u)} for n, u in self.reactions.items() if u
            ]
        if metadata and self.metadata is not None:
            out["metadata"] = self.metadata
        if self.subtype:
            out["subtype"] = self.subtype
        if self.username:
            out["username"] = self.username
        if self.files:
            out["files"] = self.files
            out["upload"] = True
        return out


@dataclass
class Envelope:
    """One Socket Mode envelope and its delivery history."""

    envelope_id: str
    type: str
    payload: dict[str, Any]
    retry_attempt: int = 0
    retry_reason: str = ""
    sent_at: float | None = None
    acked_at: float | None = None
    ack_payload: dict[str, Any] | None = None
    connection: int | None = None
    retried: bool = False
    """A redelivery of this envelope was already sent."""

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "envelope_id": self.envelope_id,
            "payload": self.payload,
            "type": self.type,
            "accepts_response_payload": self.type != "events_api",
        }
        if self.type == "events_api":
            out["retry_attempt"] = self.retry_attempt
            out["retry_reason"] = self.retry_reason
        return out


@dataclass
class SocketRecord:
    """One Socket Mode connection's life on the fake's clock."""

    number: int
    hello_at: float
    stalled_at: float | None = None
    closed_at: float | None = None


@dataclass
class AppPost:
    """One HTTP-mode request the fake made to the app, with the app's answer."""

    kind: str
    sent_at: float
    answered_at: float
    status: int
    body: str


class FakeSlack:
    """The fake Slack workspace and its servers. Use as ``async with FakeSlack() as slack``."""

    def __init__(
        self,
        *,
        bot_token: str = "xoxb-fake-bot-token",
        app_token: str = "xapp-1-fake-app-token",
        signing_secret: str = "fake-signing-secret",
        team_id: str = "T0FAKE",
        app_id: str = "A0FAKE",
        bot_user_id: str = "U0BOT",
        bot_id: str = "B0BOT",
        redeliver_after_s: float | None = None,
        max_redeliveries: int = 3,
        clock: Callable[[], float] = time.monotonic,
        tiers: dict[str, tuple[float, int]] | None = None,
        channel_post: tuple[float, int] | None = CHANNEL_POST,
        stream_error: str | None = None,
    ) -> None:
        """``tiers`` / ``channel_post``: the rate limits enforced (``{}`` / ``None``: none);
        ``stream_error``: what the ``chat.*Stream`` methods answer in a workspace without them
        (``unknown_method``, ``not_allowed_token_type``, ...; ``None``: they work)."""
        self.bot_token = bot_token
        self.app_token = app_token
        self.signing_secret = signing_secret
        self.team_id = team_id
        self.app_id = app_id
        self.bot_user_id = bot_user_id
        self.bot_id = bot_id
        self.redeliver_after_s = redeliver_after_s
        self.max_redeliveries = max_redeliveries
        self.clock = clock
        self.calls: list[ApiCall] = []
        self.messages: dict[str, list[FakeMessage]] = {}
        self.ephemerals: list[dict[str, Any]] = []
        self.rules: list[FaultRule] = []
        self.envelopes: dict[str, Envelope] = {}
        self.app_posts: list[AppPost] = []
        self.connections_opened = 0
        self.tiers = dict(TIERS if tiers is None else tiers)
        self.channel_post = channel_post
        self.stream_error = stream_error
        self._buckets: dict[str, TokenBucket] = {}
        self._limited_until: dict[str, float] = {}
        self._limited_from: dict[str, float] = {}
        self.thread_statuses: list[tuple[float, str, str, str]] = []
        """``(fake clock, channel, thread_ts, status)`` of every ``assistant.threads.setStatus``."""
        self.socket_log: list[SocketRecord] = []
        """Every Socket Mode connection: when it said hello, stalled and closed (fake clock)."""
        self._records: dict[int, SocketRecord] = {}
        self._sockets: dict[int, web.WebSocketResponse] = {}
        self._stalled: set[int] = set()
        self.refuse_links = 0
        """The next this many websocket connects are answered 503."""
        self.links_refused = 0
        self._tickets: set[str] = set()
        self._conn_ids = itertools.count(1)
        self._rr = itertools.count()
        self._pending: list[Envelope] = []
        self._ts_seq = itertools.count(1)
        self._last_ts = 0.0
        self._changed = asyncio.Condition()
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port = 0
        self.users: dict[str, dict[str, Any]] = {}
        """``users.info`` answers by user id (:meth:`add_user`)."""
        self.channel_names: dict[str, str] = {}
        """``conversations.info`` names by channel id."""
        self.uploads: dict[str, dict[str, Any]] = {}
        """Files by id from ``files.getUploadURLExternal``: filename, length, the bytes received
        at the upload URL (``None`` until then) and whether ``files.completeUploadExternal`` shared it."""

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/api/{method}", self._api)
        app.router.add_get("/api/{method}", self._api)
        app.router.add_get("/link/", self._link)
        app.router.add_post("/upload/v1/{file_id}", self._upload)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        self._session = aiohttp.ClientSession()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for ws in list(self._sockets.values()):
            with contextlib.suppress(Exception):
                await ws.close()
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> FakeSlack:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def api_url(self) -> str:
        """Web API base URL for ``AsyncWebClient(base_url=...)``."""
        return f"http://127.0.0.1:{self.port}/api/"

    # -- the workspace ------------------------------------------------------------------------
    def new_ts(self) -> str:
        """A unique, increasing Slack message timestamp (the server's clock, microseconds)."""
        next(self._ts_seq)
        self._last_ts = max(time.time(), self._last_ts + 1e-6)
        return f"{self._last_ts:.6f}"

    def find(self, channel: str, ts: str) -> FakeMessage | None:
        for msg in self.messages.get(channel, []):
            if msg.ts == ts:
                return msg
        return None

    def bot_messages(self, channel: str | None = None, thread_ts: str | None = None) -> list[FakeMessage]:
        """Messages the bot posted (optionally in one channel / thread), oldest first."""
        out: list[FakeMessage] = []
        for ch, msgs in self.messages.items():
            if channel is not None and ch != channel:
                continue
            for m in msgs:
                if m.bot_id and (thread_ts is None or m.thread_ts == thread_ts):
                    out.append(m)
        return out

    def user_message(
        self,
        channel: str,
        user: str,
        text: str,
        *,
        thread_ts: str | None = None,
        channel_type: str = "channel",
    ) -> dict[str, Any]:
        """A human writes a message; returns the ``message`` event Slack would send for it."""
        ts = self.new_ts()
        self.messages.setdefault(channel, []).append(
            FakeMessage(
                channel=channel, ts=ts, text=text, user=user, thread_ts=thread_ts, posted_at=self.clock()
            )
        )
        event: dict[str, Any] = {
            "type": "message",
            "channel": channel,
            "user": user,
            "text": text,
            "ts": ts,
            "event_ts": ts,
            "channel_type": channel_type,
            "team": self.team_id,
        }
        if thread_ts:
            event["thread_ts"] = thread_ts
        return event

    def mention_events(self, message_event: dict[str, Any]) -> list[dict[str, Any]]:
        """Both events Slack sends for a channel message that mentions the bot."""
        mention = {k: v for k, v in message_event.items() if k != "channel_type"}
        mention["type"] = "app_mention"
        return [mention, message_event]

    def event_callback(self, event: dict[str, Any]) -> dict[str, Any]:
        """The Events API outer envelope around ``event`` (new ``event_id`` per event)."""
        return {
            "token": "verification-token",
            "team_id": self.team_id,
            "api_app_id": self.app_id,
            "event": event,
            "type": "event_callback",
            "event_id": "Ev" + uuid.uuid4().hex[:10].upper(),
            "event_time": int(time.time()),
            "authorizations": [
                {
                    "team_id": self.team_id,
                    "user_id": self.bot_user_id,
                    "is_bot": True,
                    "is_enterprise_install": False,
                }
            ],
            "is_ext_shared_channel": False,
            "event_context": "4-" + uuid.uuid4().hex,
        }

    def slash_command(self, channel: str, user: str, text: str, command: str = "/rca") -> dict[str, str]:
        """The form fields of a slash command invocation."""
        return {
            "token": "verification-token",
            "team_id": self.team_id,
            "team_domain": "fake",
            "channel_id": channel,
            "channel_name": "incidents",
            "user_id": user,
            "user_name": f"name-{user.lower()}",
            "command": command,
            "text": text,
            "api_app_id": self.app_id,
            "is_enterprise_install": "false",
            "response_url": f"http://127.0.0.1:{self.port}/commands/{uuid.uuid4().hex}",
            "trigger_id": f"{next(self._ts_seq)}.{uuid.uuid4().int % 10**12}.{uuid.uuid4().hex[:16]}",
        }

    def block_action(self, message: FakeMessage, user: str, action_id: str, value: str) -> dict[str, Any]:
        """The ``block_actions`` payload of a button click on ``message``."""
        return {
            "type": "block_actions",
            "user": {"id": user, "username": f"name-{user.lower()}", "team_id": self.team_id},
            "api_app_id": self.app_id,
            "token": "verification-token",
            "container": {"type": "message", "message_ts": message.ts, "channel_id": message.channel},
            "trigger_id": f"{next(self._ts_seq)}.{uuid.uuid4().hex[:12]}",
            "team": {"id": self.team_id, "domain": "fake"},
            "channel": {"id": message.channel, "name": "incidents"},
            "message": message.to_api(),
            "response_url": f"http://127.0.0.1:{self.port}/actions/{uuid.uuid4().hex}",
            "actions": [
                {
                    "action_id": action_id,
                    "block_id": "feedback",
                    "value": value,
                    "type": "button",
                    "action_ts": str(time.time()),
                }
            ],
        }

    # -- waiting --------------------------------------------------------------------------------
    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 30.0) -> None:
        """Wait until ``predicate()`` holds (re-checked on every change), or fail after the deadline."""

        async def _wait() -> None:
            async with self._changed:
                await self._changed.wait_for(predicate)

        try:
            await asyncio.wait_for(_wait(), timeout_s)
        except TimeoutError:
            raise AssertionError(f"fake Slack: condition not met within {timeout_s} s") from None

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # -- Web API ------------------------------------------------------------------------------
    async def _params(self, request: web.Request) -> dict[str, Any]:
        params: dict[str, Any] = dict(request.query)
        if request.can_read_body:
            if request.content_type == "application/json":
                body = await request.json()
                if isinstance(body, dict):
                    params.update(body)
            else:
                form = await request.post()
                params.update({k: v for k, v in form.items() if isinstance(v, str)})
        for key in ("blocks", "attachments"):  # form-encoded calls send these as JSON strings
            if isinstance(params.get(key), str):
                with contextlib.suppress(ValueError):
                    params[key] = json.loads(params[key])
        return params

    async def _api(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        params = await self._params(request)
        call = ApiCall(method=method, params=params, at=self.clock())
        self.calls.append(call)
        try:
            call.inside_retry_after = call.at < self._limited_until.get(method, -math.inf)
            if call.inside_retry_after:
                call.window_from = self._limited_from.get(method)
            wait = self._rate_limit(method, call.channel, call.at)
            if wait > 0:
                retry_after = max(1, math.ceil(wait))
                self._limit(method, call.at, retry_after)
                call.ok, call.fault, call.status = False, "tier", 429
                call.error, call.retry_after_s = "ratelimited", retry_after
                return web.json_response(
                    {"ok": False, "error": "ratelimited"},
                    status=429,
                    headers={"Retry-After": str(retry_after)},
                )
            for rule in self.rules:
                fault = rule.draw(method)
                if fault is None:
                    continue
                call.fault = fault
                call.ok = False
                if fault == "ratelimited":
                    call.status, call.error, call.retry_after_s = 429, "ratelimited", rule.retry_after_s
                    self._limit(method, call.at, rule.retry_after_s)
                    return web.json_response(
                        {"ok": False, "error": "ratelimited"},
                        status=429,
                        headers={"Retry-After": str(rule.retry_after_s)},
                    )
                if rule.after:  # it takes effect, then the answer is lost
                    self._dispatch(method, params, request.headers.get("Authorization", ""))
                if fault == "server_error":
                    call.status, call.error = 500, "internal_error"
                    return web.Response(
                        status=500,
                        text="<html><body>500 Internal Server Error</body></html>",
                        content_type="text/html",
                    )
                call.status, call.error = 0, "dropped"
                assert request.transport is not None
                request.transport.abort()
                raise asyncio.CancelledError  # nothing more is written: the client sees a disconnect
            result = self._dispatch(method, params, request.headers.get("Authorization", ""))
            call.ok = bool(result.get("ok"))
            call.error = None if call.ok else str(result.get("error"))
            return web.json_response(result)
        finally:
            await self._notify()

    def _limit(self, method: str, at: float, retry_after: float) -> None:
        if at + retry_after > self._limited_until.get(method, -math.inf):
            if self._limited_until.get(method, -math.inf) < at:
                self._limited_from[method] = at
            self._limited_until[method] = at + retry_after

    def _rate_limit(self, method: str, channel: str | None, now: float) -> float:
        """Seconds until the call would be allowed (0: allowed now, its tokens are taken)."""
        waits: list[float] = []
        tier = self.tiers.get(method)
        buckets: list[TokenBucket] = []
        if tier is not None:
            buckets.append(self._buckets.setdefault(method, TokenBucket(*tier)))
        if method == "chat.postMessage" and channel and self.channel_post is not None:
            refill, burst = self.channel_post
            buckets.append(self._buckets.setdefault(f"{method}#{channel}", TokenBucket(0, burst, refill)))
        taken: list[TokenBucket] = []
        for bucket in buckets:
            wait = bucket.take(now)
            if wait > 0:
                waits.append(wait)
            else:
                taken.append(bucket)
        if waits:  # a refused call takes nothing from any bucket
            for bucket in taken:
                bucket.tokens += 1.0
            return max(waits)
        return 0.0

    def calls_per_window(self, method: str, window_s: float = 60.0) -> int:
        """The most accepted calls of ``method`` inside any ``window_s`` window."""
        times = sorted(c.at for c in self.calls if c.method == method and c.ok)
        best, j = 0, 0
        for i, t in enumerate(times):
            while times[j] <= t - window_s:
                j += 1
            best = max(best, i - j + 1)
        return best

    def _dispatch(self, method: str, params: dict[str, Any], auth: str) -> dict[str, Any]:
        token = auth.removeprefix("Bearer ").strip() or str(params.get("token", ""))
        if not token:
            return {"ok": False, "error": "not_authed"}
        if method == "apps.connections.open":
            if token != self.app_token:
                return {
                    "ok": False,
                    "error": "not_allowed_token_type" if token == self.bot_token else "invalid_auth",
                }
            ticket = uuid.uuid4().hex
            self._tickets.add(ticket)
            return {
                "ok": True,
                "url": f"ws://127.0.0.1:{self.port}/link/?ticket={ticket}&app_id={self.app_id}",
            }
        if token != self.bot_token:
            return {"ok": False, "error": "invalid_auth"}
        handler = {
            "auth.test": self._auth_test,
            "chat.postMessage": self._post_message,
            "chat.update": self._update,
            "chat.postEphemeral": self._post_ephemeral,
            "conversations.replies": self._replies,
            "conversations.history": self._history,
            "chat.startStream": self._start_stream,
            "chat.appendStream": self._append_stream,
            "chat.stopStream": self._stop_stream,
            "reactions.add": self._reaction_add,
            "reactions.remove": self._reaction_remove,
            "assistant.threads.setStatus": self._set_status,
            "conversations.info": self._conversations_info,
            "users.info": self._users_info,
            "files.getUploadURLExternal": self._get_upload_url,
            "files.completeUploadExternal": self._complete_upload,
        }.get(method)
        if handler is None:
            return {"ok": False, "error": "unknown_method"}
        return handler(params)

    def _auth_test(self, params: dict[str, Any]) -> dict[str, Any]:
        return {
            "ok": True,
            "url": "https://fake.slack.com/",
            "team": "Fake",
            "user": "opsbot",
            "team_id": self.team_id,
            "user_id": self.bot_user_id,
            "bot_id": self.bot_id,
            "is_enterprise_install": False,
        }

    @staticmethod
    def _check_content(params: dict[str, Any]) -> str | None:
        text = params.get("text")
        blocks = params.get("blocks")
        if not text and not blocks:
            return "no_text"
        if text and len(str(text)) > 40_000:
            return "msg_too_long"
        if blocks is not None:
            if not isinstance(blocks, list) or len(blocks) > 50:
                return "invalid_blocks"
            for block in blocks:
                if not isinstance(block, dict) or "type" not in block:
                    return "invalid_blocks"
                if block["type"] == "section":
                    section_text = (block.get("text") or {}).get("text", "")
                    if len(section_text) > 3000:
                        return "invalid_blocks"
                if block["type"] == "actions" and len(block.get("elements", [])) > 25:
                    return "invalid_blocks"
                if block["type"] == "context" and len(block.get("elements", [])) > 10:
                    return "invalid_blocks"
        return None

    def _post_message(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = params.get("channel")
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        error = self._check_content(params)
        if error:
            return {"ok": False, "error": error}
        metadata = params.get("metadata")
        if isinstance(metadata, str):  # form-encoded calls send it as a JSON string
            try:
                metadata = json.loads(metadata)
            except ValueError:
                return {"ok": False, "error": "invalid_metadata_format"}
        if metadata is not None and not self._metadata_ok(metadata):
            return {"ok": False, "error": "invalid_metadata_format"}
        thread_ts = params.get("thread_ts") or None
        msg = FakeMessage(
            channel=str(channel),
            ts=self.new_ts(),
            text=str(params.get("text") or ""),
            user=self.bot_user_id,
            thread_ts=str(thread_ts) if thread_ts else None,
            blocks=params.get("blocks"),
            bot_id=self.bot_id,
            posted_at=self.clock(),
            metadata=metadata,
        )
        self.messages.setdefault(msg.channel, []).append(msg)
        return {"ok": True, "channel": msg.channel, "ts": msg.ts, "message": msg.to_api()}

    @staticmethod
    def _metadata_ok(metadata: Any) -> bool:
        return (
            isinstance(metadata, dict)
            and isinstance(metadata.get("event_type"), str)
            and isinstance(metadata.get("event_payload"), dict)
        )

    @staticmethod
    def _chunks_error(chunks: Any) -> str | None:
        if chunks is None:
            return None
        if not isinstance(chunks, list):
            return "invalid_chunks"
        for chunk in chunks:
            if not isinstance(chunk, dict):
                return "invalid_chunks"
            kind = chunk.get("type")
            if kind == "markdown_text":
                if not isinstance(chunk.get("text"), str):
                    return "invalid_chunks"
                if len(chunk["text"]) > 12_000:
                    return "msg_too_long"
            elif kind == "task_update":
                if (
                    not chunk.get("id")
                    or not chunk.get("title")
                    or chunk.get("status") not in _CHUNK_STATUSES
                ):
                    return "invalid_chunks"
            elif kind == "plan_update":
                if not chunk.get("title"):
                    return "invalid_chunks"
            else:
                return "invalid_chunks"
        return None

    @staticmethod
    def _stream_text(params: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
        """Markdown and task / plan chunks of one stream call."""
        text = str(params.get("markdown_text") or "")
        others: list[dict[str, Any]] = []
        for chunk in params.get("chunks") or []:
            if chunk.get("type") == "markdown_text":
                text += chunk["text"]
            else:
                others.append(chunk)
        return text, others

    def _stream_message(self, params: dict[str, Any]) -> tuple[FakeMessage | None, str | None]:
        channel, ts = str(params.get("channel", "")), str(params.get("ts", ""))
        if not channel:
            return None, "channel_not_found"
        msg = self.find(channel, ts)
        if msg is None:
            return None, "message_not_found"
        if msg.bot_id != self.bot_id:
            return None, "message_not_owned_by_app"
        if not msg.streaming:
            return None, "message_not_in_streaming_state"
        return msg, None

    def _start_stream(self, params: dict[str, Any]) -> dict[str, Any]:
        if self.stream_error:
            return {"ok": False, "error": self.stream_error}
        channel = str(params.get("channel") or "")
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        thread_ts = params.get("thread_ts")
        if not thread_ts or self.find(channel, str(thread_ts)) is None:
            return {"ok": False, "error": "invalid_arguments" if not thread_ts else "cannot_reply_to_message"}
        if not channel.startswith("D"):  # streaming into a channel names who the stream is for
            if not params.get("recipient_team_id"):
                return {"ok": False, "error": "missing_recipient_team_id"}
            if not params.get("recipient_user_id"):
                return {"ok": False, "error": "missing_recipient_user_id"}
        if params.get("task_display_mode") not in (None, "timeline", "plan"):
            return {"ok": False, "error": "invalid_arguments"}
        error = self._chunks_error(params.get("chunks"))
        if error:
            return {"ok": False, "error": error}
        text, others = self._stream_text(params)
        if not text and not others:
            return {"ok": False, "error": "no_text"}
        if len(text) > 12_000:
            return {"ok": False, "error": "msg_too_long"}
        msg = FakeMessage(
            channel=channel,
            ts=self.new_ts(),
            text=text,
            user=self.bot_user_id,
            thread_ts=str(thread_ts),
            bot_id=self.bot_id,
            posted_at=self.clock(),
            streaming=True,
            streamed=True,
            chunks=others,
        )
        self.messages.setdefault(channel, []).append(msg)
        return {"ok": True, "channel": channel, "ts": msg.ts}

    def _append_stream(self, params: dict[str, Any]) -> dict[str, Any]:
        if self.stream_error:
            return {"ok": False, "error": self.stream_error}
        msg, error = self._stream_message(params)
        if msg is None:
            return {"ok": False, "error": error}
        error = self._chunks_error(params.get("chunks"))
        if error:
            return {"ok": False, "error": error}
        text, others = self._stream_text(params)
        if not text and not others:
            return {"ok": False, "error": "no_text"}
        if len(msg.text) + len(text) > 40_000:
            return {"ok": False, "error": "msg_too_long"}
        msg.text += text
        msg.chunks += others
        msg.appends.append((self.clock(), text))
        return {"ok": True, "channel": msg.channel, "ts": msg.ts}

    def _stop_stream(self, params: dict[str, Any]) -> dict[str, Any]:
        if self.stream_error:
            return {"ok": False, "error": self.stream_error}
        msg, error = self._stream_message(params)
        if msg is None:
            return {"ok": False, "error": error}
        error = self._chunks_error(params.get("chunks"))
        blocks = params.get("blocks")
        if error is None and blocks is not None:
            error = self._check_content({"blocks": blocks})
        metadata = params.get("metadata")
        if error is None and metadata is not None and not self._metadata_ok(metadata):
            error = "invalid_metadata_format"
        if error:
            return {"ok": False, "error": error}
        text, others = self._stream_text(params)
        if len(msg.text) + len(text) > 40_000:
            return {"ok": False, "error": "msg_too_long"}
        msg.text += text
        msg.chunks += others
        if text:
            msg.appends.append((self.clock(), text))
        msg.blocks = blocks
        msg.metadata = metadata
        msg.streaming = False
        out = msg.to_api()
        out["subtype"] = "bot_message"
        return {"ok": True, "channel": msg.channel, "ts": msg.ts, "message": out}

    def _reaction_target(self, params: dict[str, Any]) -> tuple[FakeMessage | None, str | None]:
        channel, ts, name = params.get("channel"), params.get("timestamp"), params.get("name")
        if not channel or not ts:
            return None, "no_item_specified"
        if not name or not _REACTION_NAME.match(str(name)):
            return None, "invalid_name"
        msg = self.find(str(channel), str(ts))
        if msg is None:
            return None, "message_not_found"
        return msg, None

    def _reaction_add(self, params: dict[str, Any]) -> dict[str, Any]:
        msg, error = self._reaction_target(params)
        if msg is None:
            return {"ok": False, "error": error}
        users = msg.reactions.setdefault(str(params["name"]), [])
        if self.bot_user_id in users:
            return {"ok": False, "error": "already_reacted"}
        if len([n for n, u in msg.reactions.items() if u]) > 23:
            return {"ok": False, "error": "too_many_reactions"}
        users.append(self.bot_user_id)
        msg.reaction_log.append((self.clock(), "add", str(params["name"])))
        return {"ok": True}

    def _reaction_remove(self, params: dict[str, Any]) -> dict[str, Any]:
        msg, error = self._reaction_target(params)
        if msg is None:
            return {"ok": False, "error": error}
        users = msg.reactions.get(str(params["name"]), [])
        if self.bot_user_id not in users:
            return {"ok": False, "error": "no_reaction"}
        users.remove(self.bot_user_id)
        msg.reaction_log.append((self.clock(), "remove", str(params["name"])))
        return {"ok": True}

    def _set_status(self, params: dict[str, Any]) -> dict[str, Any]:
        channel, thread_ts = params.get("channel_id"), params.get("thread_ts")
        if not channel or self.find(str(channel), str(thread_ts or "")) is None:
            return {"ok": False, "error": "channel_not_found"}
        if "status" not in params:
            return {"ok": False, "error": "invalid_arguments"}
        self.thread_statuses.append((self.clock(), str(channel), str(thread_ts), str(params["status"])))
        return {"ok": True}

    def _update(self, params: dict[str, Any]) -> dict[str, Any]:
        channel, ts = str(params.get("channel", "")), str(params.get("ts", ""))
        msg = self.find(channel, ts)
        if msg is None:
            return {"ok": False, "error": "message_not_found"}
        if msg.bot_id != self.bot_id:
            return {"ok": False, "error": "cant_update_message"}
        error = self._check_content(params)
        if error:
            return {"ok": False, "error": error}
        msg.text = str(params.get("text") or "")
        msg.blocks = params.get("blocks")
        msg.edits.append((self.clock(), msg.text, msg.blocks))
        return {"ok": True, "channel": channel, "ts": ts, "text": msg.text, "message": msg.to_api()}

    def _post_ephemeral(self, params: dict[str, Any]) -> dict[str, Any]:
        if not params.get("channel"):
            return {"ok": False, "error": "channel_not_found"}
        if not params.get("user"):
            return {"ok": False, "error": "user_not_in_channel"}
        error = self._check_content(params)
        if error:
            return {"ok": False, "error": error}
        ts = self.new_ts()
        self.ephemerals.append({**params, "message_ts": ts, "at": self.clock()})
        return {"ok": True, "message_ts": ts}

    def _replies(self, params: dict[str, Any]) -> dict[str, Any]:
        channel, ts = str(params.get("channel", "")), str(params.get("ts", ""))
        parent = self.find(channel, ts)
        if parent is None:
            return {"ok": False, "error": "thread_not_found"}
        thread = [parent] + [m for m in self.messages.get(channel, []) if m.thread_ts == ts and m.ts != ts]
        thread = [m for m in thread if m is parent or self._newer(m, params.get("oldest"))]
        # Cursor pages, oldest first: the parent leads the first page only; next_cursor names the
        # first message of the next page (opaque base64, as Slack's), "" on the last page.
        start = 0
        if params.get("cursor"):
            try:
                after = base64.b64decode(str(params["cursor"])).decode().removeprefix("next_ts:")
            except (ValueError, UnicodeDecodeError):
                return {"ok": False, "error": "invalid_cursor"}
            start = next((i for i, m in enumerate(thread) if m.ts == after), -1)
            if start < 0:
                return {"ok": False, "error": "invalid_cursor"}
        limit = min(int(params.get("limit") or 1000), 1000)
        page = thread[start : start + limit]
        more = start + limit < len(thread)
        cursor = base64.b64encode(f"next_ts:{thread[start + limit].ts}".encode()).decode() if more else ""
        return {
            "ok": True,
            "messages": [m.to_api(metadata=self._flag(params, "include_all_metadata")) for m in page],
            "has_more": more,
            "response_metadata": {"next_cursor": cursor},
        }

    def _history(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = str(params.get("channel", ""))
        if channel not in self.messages:
            return {"ok": False, "error": "channel_not_found"}
        top = [
            m
            for m in self.messages[channel]
            if (m.thread_ts is None or m.thread_ts == m.ts) and self._newer(m, params.get("oldest"))
        ]
        top.sort(key=lambda m: float(m.ts), reverse=True)  # newest first, as Slack returns them
        limit = int(params.get("limit") or 100)
        return {
            "ok": True,
            "messages": [m.to_api(metadata=self._flag(params, "include_all_metadata")) for m in top[:limit]],
            "has_more": len(top) > limit,
            "response_metadata": {"next_cursor": ""},
        }

    @staticmethod
    def _newer(msg: FakeMessage, oldest: object) -> bool:
        return oldest is None or float(msg.ts) > float(str(oldest))

    @staticmethod
    def _flag(params: dict[str, Any], name: str) -> bool:
        return str(params.get(name, "")).lower() in ("true", "1")

    def add_user(self, user_id: str, name: str, *, display_name: str = "", is_bot: bool = False) -> None:
        """A workspace member ``users.info`` knows."""
        self.users[user_id] = {
            "id": user_id,
            "team_id": self.team_id,
            "name": name,
            "real_name": display_name or name,
            "is_bot": is_bot,
            "profile": {"display_name": display_name, "real_name": display_name or name},
        }

    def bot_message(
        self, channel: str, text: str, *, thread_ts: str | None, bot_id: str, username: str
    ) -> FakeMessage:
        """Another integration posts (``subtype: bot_message``, its own ``bot_id``)."""
        msg = FakeMessage(
            channel=channel,
            ts=self.new_ts(),
            text=text,
            user="",
            thread_ts=thread_ts,
            bot_id=bot_id,
            posted_at=self.clock(),
            subtype="bot_message",
            username=username,
        )
        self.messages.setdefault(channel, []).append(msg)
        return msg

    def _conversations_info(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = str(params.get("channel", ""))
        if channel not in self.channel_names and channel not in self.messages:
            return {"ok": False, "error": "channel_not_found"}
        name = self.channel_names.get(channel, channel.lower())
        return {"ok": True, "channel": {"id": channel, "name": name, "is_channel": True, "is_member": True}}

    def _users_info(self, params: dict[str, Any]) -> dict[str, Any]:
        user = self.users.get(str(params.get("user", "")))
        if user is None:
            return {"ok": False, "error": "user_not_found"}
        return {"ok": True, "user": user}

    def _get_upload_url(self, params: dict[str, Any]) -> dict[str, Any]:
        filename, length = params.get("filename"), params.get("length")
        if not filename or length in (None, ""):
            return {"ok": False, "error": "invalid_arguments"}
        try:
            size = int(str(length))
        except ValueError:
            return {"ok": False, "error": "invalid_arguments"}
        file_id = f"F{uuid.uuid4().hex[:10].upper()}"
        self.uploads[file_id] = {"filename": str(filename), "length": size, "data": None, "shared": False}
        return {
            "ok": True,
            "upload_url": f"http://127.0.0.1:{self.port}/upload/v1/{file_id}",
            "file_id": file_id,
        }

    async def _upload(self, request: web.Request) -> web.StreamResponse:
        """The upload URL: raw bytes or one multipart part; ``OK - <length>`` as files.slack.com says."""
        file = self.uploads.get(request.match_info["file_id"])
        if file is None:
            return web.Response(status=404, text="file not found")
        if request.content_type.startswith("multipart/"):
            reader = await request.multipart()
            part = await reader.next()
            data = await part.read() if isinstance(part, aiohttp.BodyPartReader) else b""
        else:
            data = await request.read()
        file["data"] = bytes(data)
        await self._notify()
        return web.Response(text=f"OK - {len(data)}")

    def _complete_upload(self, params: dict[str, Any]) -> dict[str, Any]:
        files = params.get("files")
        if isinstance(files, str):
            try:
                files = json.loads(files)
            except ValueError:
                return {"ok": False, "error": "invalid_arguments"}
        if not isinstance(files, list) or not files:
            return {"ok": False, "error": "invalid_arguments"}
        shared = []
        for item in files:
            file = self.uploads.get(str(item.get("id", ""))) if isinstance(item, dict) else None
            if file is None or file["data"] is None:
                return {"ok": False, "error": "file_not_found"}
            if len(file["data"]) != file["length"]:
                return {"ok": False, "error": "file_upload_size_mismatch"}
            shared.append(
                {
                    "id": item["id"],
                    "name": file["filename"],
                    "title": item.get("title") or file["filename"],
                    "size": file["length"],
                    "mimetype": "text/markdown" if file["filename"].endswith(".md") else "text/plain",
                }
            )
        channel = params.get("channel_id")
        if channel:
            thread_ts = params.get("thread_ts") or None
            if thread_ts and self.find(str(channel), str(thread_ts)) is None:
                return {"ok": False, "error": "invalid_thread_ts"}
            msg = FakeMessage(
                channel=str(channel),
                ts=self.new_ts(),
                text=str(params.get("initial_comment") or ""),
                user=self.bot_user_id,
                thread_ts=str(thread_ts) if thread_ts else None,
                bot_id=self.bot_id,
                posted_at=self.clock(),
                files=shared,
            )
            self.messages.setdefault(msg.channel, []).append(msg)
        for item in shared:
            self.uploads[item["id"]]["shared"] = bool(channel)
        return {"ok": True, "files": [{"id": f["id"], "title": f["title"]} for f in shared]}

    # -- Socket Mode ------------------------------------------------------------------------------
    @property
    def open_connections(self) -> int:
        """Connections open and not stalled."""
        return sum(1 for n, ws in self._sockets.items() if n not in self._stalled and not ws.closed)

    def stall(self, connection: int | None = None) -> None:
        """Half-open: from now on nothing is sent on the open connections (or only ``connection``, a
        :class:`SocketRecord` number) and nothing read from them (pings go unanswered, acks are
        lost), and the server keeps counting them as open and routing envelopes into them, as a
        server does that cannot tell, until :meth:`unstall`."""
        now = self.clock()
        for number in self._sockets:
            if connection is not None and number != connection:
                continue
            if number not in self._stalled:
                self._stalled.add(number)
                self._records[number].stalled_at = now

    async def unstall(self) -> None:
        """The network is back: stalled connections the client has closed meanwhile are noticed
        (their unacknowledged envelopes redelivered); the others carry traffic again."""
        for number in list(self._stalled):
            self._stalled.discard(number)
            ws = self._sockets.get(number)
            if ws is None or ws.closed:
                self._sockets.pop(number, None)
                await self._requeue_unacked(number)
        await self._notify()

    async def _link(self, request: web.Request) -> web.StreamResponse:
        ticket = request.query.get("ticket", "")
        if ticket not in self._tickets:
            return web.Response(status=401, text="invalid ticket")
        if self.refuse_links > 0:  # the websocket endpoint is having trouble
            self.refuse_links -= 1
            self.links_refused += 1
            await self._notify()
            return web.Response(status=503, text="service unavailable")
        self._tickets.discard(ticket)
        ws = web.WebSocketResponse(autoping=False)
        await ws.prepare(request)
        if self.open_connections >= MAX_SOCKETS:
            await ws.send_json({"type": "disconnect", "reason": "too_many_websockets"})
            await ws.close()
            return ws
        conn = next(self._conn_ids)
        self._sockets[conn] = ws
        self.connections_opened += 1
        record = SocketRecord(conn, hello_at=self.clock())
        self._records[conn] = record
        self.socket_log.append(record)
        await ws.send_json(
            {
                "type": "hello",
                "num_connections": len(self._sockets),
                "debug_info": {
                    "host": "applink-fake",
                    "build_number": 1,
                    "approximate_connection_time": 3600,
                },
                "connection_info": {"app_id": self.app_id},
            }
        )
        await self._notify()
        await self._flush_pending()
        try:
            async for frame in ws:
                if conn in self._stalled:
                    continue  # half-open: nothing gets through either way
                if frame.type == aiohttp.WSMsgType.PING:
                    await ws.pong(frame.data)
                    continue
                if frame.type != aiohttp.WSMsgType.TEXT:
                    continue
                with contextlib.suppress(ValueError):
                    data = json.loads(frame.data)
                    env = self.envelopes.get(str(data.get("envelope_id")))
                    if env is not None and env.acked_at is None:
                        env.acked_at = self.clock()
                        env.ack_payload = data.get("payload")
                        await self._notify()
        finally:
            record.closed_at = self.clock()
            if conn not in self._stalled:  # a stalled one stays counted until the network is back
                self._sockets.pop(conn, None)
                await self._requeue_unacked(conn)
            await self._notify()
        return ws

    async def _send(self, env: Envelope, exclude: int | None = None) -> None:
        conns = sorted(n for n in self._sockets if n != exclude)
        if not conns:
            self._pending.append(env)
            return
        conn = conns[next(self._rr) % len(conns)]
        env.connection = conn
        env.sent_at = self.clock()
        if conn not in self._stalled:
            try:
                await self._sockets[conn].send_json(env.to_wire())
            except Exception:  # the socket went away under us: deliver on the next connection
                env.sent_at = None
                self._pending.append(env)
                return
        # (into a stalled connection the envelope is lost: only the redelivery can bring it)
        if self.redeliver_after_s is not None:
            task = asyncio.create_task(self._redeliver_if_unacked(env))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _flush_pending(self) -> None:
        pending, self._pending = self._pending, []
        for env in pending:
            await self._send(env)

    async def _retry(self, env: Envelope, reason: str) -> None:
        """Slack's redelivery: a new envelope with the same payload and the next retry_attempt."""
        if env.retry_attempt >= self.max_redeliveries:
            return
        again = Envelope(
            envelope_id=str(uuid.uuid4()),
            type=env.type,
            payload=env.payload,
            retry_attempt=env.retry_attempt + 1,
            retry_reason=reason,
        )
        self.envelopes[again.envelope_id] = again
        await self._send(again, exclude=env.connection)  # Slack retries on another connection

    async def _requeue_unacked(self, conn: int) -> None:
        for env in list(self.envelopes.values()):
            if env.connection == conn and env.acked_at is None and not env.retried:
                env.retried = True
                await self._retry(env, "timeout")

    async def _redeliver_if_unacked(self, env: Envelope) -> None:
        assert self.redeliver_after_s is not None
        await asyncio.sleep(self.redeliver_after_s)
        if env.acked_at is None and not env.retried:
            env.retried = True
            await self._retry(env, "timeout")

    async def deliver(
        self, type_: str, payload: dict[str, Any], *, retry_attempt: int = 0, retry_reason: str = ""
    ) -> Envelope:
        """Send one envelope over an open connection (round robin), or when one opens."""
        env = Envelope(
            envelope_id=str(uuid.uuid4()),
            type=type_,
            payload=payload,
            retry_attempt=retry_attempt,
            retry_reason=retry_reason,
        )
        self.envelopes[env.envelope_id] = env
        await self._send(env)
        return env

    async def deliver_event(self, event: dict[str, Any], *, copies: int = 1) -> list[Envelope]:
        """Deliver one event ``copies`` times, as Slack's retries do (same ``event_id``)."""
        callback = self.event_callback(event)
        out = []
        for attempt in range(copies):
            out.append(
                await self.deliver(
                    "events_api",
                    callback,
                    retry_attempt=attempt,
                    retry_reason="" if attempt == 0 else "timeout",
                )
            )
        return out

    async def disconnect(self, *, reason: str = "refresh_requested", drop: bool = True) -> None:
        """Tell every connection to reconnect; ``drop``: then close the sockets from this side."""
        for ws in [w for n, w in self._sockets.items() if n not in self._stalled]:
            with contextlib.suppress(Exception):
                await ws.send_json(
                    {"type": "disconnect", "reason": reason, "debug_info": {"host": "applink-fake"}}
                )
        if drop:
            for ws in [w for n, w in self._sockets.items() if n not in self._stalled]:
                with contextlib.suppress(Exception):
                    await ws.close()

    # -- HTTP mode ------------------------------------------------------------------------------
    def sign(self, body: str, timestamp: int | None = None, secret: str | None = None) -> dict[str, str]:
        """``X-Slack-Request-Timestamp`` and ``X-Slack-Signature`` (v0) headers for ``body``."""
        ts = str(int(time.time()) if timestamp is None else timestamp)
        base = f"v0:{ts}:{body}".encode()
        digest = hmac.new((secret or self.signing_secret).encode(), base, hashlib.sha256).hexdigest()
        return {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": f"v0={digest}"}

    async def post_to_app(
        self,
        url: str,
        kind: str,
        payload: dict[str, Any],
        *,
        retry_num: int | None = None,
        retry_reason: str = "http_timeout",
        timestamp: int | None = None,
        secret: str | None = None,
    ) -> AppPost:
        """POST an event (JSON), slash command (form) or interaction (form ``payload=``) to the app."""
        if kind == "event":
            body, ctype = json.dumps(payload), "application/json"
        elif kind == "command":
            body, ctype = urllib.parse.urlencode(payload), "application/x-www-form-urlencoded"
        else:
            body = urllib.parse.urlencode({"payload": json.dumps(payload)})
            ctype = "application/x-www-form-urlencoded"
        headers = {"Content-Type": ctype, **self.sign(body, timestamp, secret)}
        if retry_num is not None:
            headers["X-Slack-Retry-Num"] = str(retry_num)
            headers["X-Slack-Retry-Reason"] = retry_reason
        assert self._session is not None
        sent = self.clock()
        async with self._session.post(url, data=body.encode(), headers=headers) as resp:
            text = await resp.text()
            post = AppPost(kind=kind, sent_at=sent, answered_at=self.clock(), status=resp.status, body=text)
        self.app_posts.append(post)
        await self._notify()
        return post
