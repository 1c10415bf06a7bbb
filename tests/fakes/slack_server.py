"""A fake Slack that speaks the real wire protocol, for the real slack-sdk / slack-bolt clients.

Web API (``POST /api/<method>``): ``auth.test``, ``apps.connections.open``, ``chat.postMessage``,
``chat.update``, ``chat.postEphemeral``, ``conversations.replies`` with Slack's JSON envelopes
(``{"ok": true, ...}`` / ``{"ok": false, "error": "..."}``) and error codes. Faults are chosen per
request by :class:`FaultRule` s the test sets: ``429`` + ``Retry-After`` (``ratelimited``), ``500``
with an HTML body, or a dropped connection. Every call is recorded with the fake's own monotonic
timestamp (:attr:`FakeSlack.calls`).

Socket Mode: ``apps.connections.open`` returns a ``ws://`` URL on this server; the websocket sends
``hello``, delivers envelopes (``events_api``, ``slash_commands``, ``interactive``), records acks by
``envelope_id`` and redelivers unacked envelopes (``retry_attempt`` / ``retry_reason``) when their
connection drops or after ``redeliver_after_s``. :meth:`FakeSlack.disconnect` sends
``{"type": "disconnect", "reason": "refresh_requested"}`` and can drop the socket.

HTTP mode: :meth:`FakeSlack.post_to_app` signs (v0 scheme) and POSTs events, slash commands and
interactions to the app's URL, with ``X-Slack-Retry-Num`` / ``X-Slack-Retry-Reason`` when asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import json
import random
import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

CHAT_METHODS = frozenset({"chat.postMessage", "chat.update", "chat.postEphemeral"})


@dataclass
class FaultRule:
    """Per-request fault injection: each matching call draws once from the probabilities.

    ``methods``: Web API methods it applies to (``None``: all but auth/connection methods).
    ``times``: stop after injecting this many faults (``None``: no limit).
    """

    methods: frozenset[str] | None = CHAT_METHODS
    ratelimited: float = 0.0
    server_error: float = 0.0
    dropped: float = 0.0
    retry_after_s: int = 1
    times: int | None = None
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
    retry_after_s: int | None = None

    @property
    def channel(self) -> str | None:
        value = self.params.get("channel")
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

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "message", "ts": self.ts, "text": self.text, "user": self.user}
        if self.thread_ts:
            out["thread_ts"] = self.thread_ts
        if self.bot_id:
            out["bot_id"] = self.bot_id
        if self.blocks is not None:
            out["blocks"] = self.blocks
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
    ) -> None:
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
        self._sockets: dict[int, web.WebSocketResponse] = {}
        self._tickets: set[str] = set()
        self._conn_ids = itertools.count(1)
        self._rr = itertools.count()
        self._pending: list[Envelope] = []
        self._ts_seq = itertools.count(1)
        self._base_ts = int(time.time())
        self._changed = asyncio.Condition()
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port = 0

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/api/{method}", self._api)
        app.router.add_get("/api/{method}", self._api)
        app.router.add_get("/link/", self._link)
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
        """A unique, increasing Slack message timestamp."""
        return f"{self._base_ts}.{next(self._ts_seq):06d}"

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
            for rule in self.rules:
                fault = rule.draw(method)
                if fault is None:
                    continue
                call.fault = fault
                call.ok = False
                if fault == "ratelimited":
                    call.status, call.error, call.retry_after_s = 429, "ratelimited", rule.retry_after_s
                    return web.json_response(
                        {"ok": False, "error": "ratelimited"},
                        status=429,
                        headers={"Retry-After": str(rule.retry_after_s)},
                    )
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
        )
        self.messages.setdefault(msg.channel, []).append(msg)
        return {"ok": True, "channel": msg.channel, "ts": msg.ts, "message": msg.to_api()}

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
        return {
            "ok": True,
            "messages": [m.to_api() for m in thread],
            "has_more": False,
            "response_metadata": {"next_cursor": ""},
        }

    # -- Socket Mode ------------------------------------------------------------------------------
    @property
    def open_connections(self) -> int:
        return len(self._sockets)

    async def _link(self, request: web.Request) -> web.StreamResponse:
        ticket = request.query.get("ticket", "")
        if ticket not in self._tickets:
            return web.Response(status=401, text="invalid ticket")
        self._tickets.discard(ticket)
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        conn = next(self._conn_ids)
        self._sockets[conn] = ws
        self.connections_opened += 1
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
            self._sockets.pop(conn, None)
            await self._requeue_unacked(conn)
            await self._notify()
        return ws

    async def _send(self, env: Envelope) -> None:
        conns = sorted(self._sockets)
        if not conns:
            self._pending.append(env)
            return
        conn = conns[next(self._rr) % len(conns)]
        env.connection = conn
        env.sent_at = self.clock()
        try:
            await self._sockets[conn].send_json(env.to_wire())
        except Exception:  # the socket went away under us: deliver on the next connection
            env.sent_at = None
            self._pending.append(env)
            return
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
        await self._send(again)

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
        for ws in list(self._sockets.values()):
            with contextlib.suppress(Exception):
                await ws.send_json(
                    {"type": "disconnect", "reason": reason, "debug_info": {"host": "applink-fake"}}
                )
        if drop:
            for ws in list(self._sockets.values()):
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
