"""A protocol-faithful fake Mattermost server (REST v4 + websocket), for opsbot's adapter tests.

It serves the REST v4 endpoints opsbot uses (``GET /posts/{id}/thread`` with the server's paging:
``perPage`` up to 200, ``direction``, ``fromCreateAt`` / ``fromPost``, ``has_next``; ``POST /files``
multipart uploads attached by ``file_ids`` on a new post) with ``Content-Type: application/json`` and the
server's error body (``{id, message, detailed_error, request_id, status_code}`` plus the
``X-Request-Id`` header), the websocket at ``/api/v4/websocket`` (``authentication_challenge`` ->
``hello`` with ``seq`` 0 and the ``{"status": "OK", "seq_reply": 1}`` reply, then ``posted`` /
``post_edited`` events whose ``data.post`` is a JSON string, ``seq`` increasing per connection),
and it can play Mattermost's part towards opsbot's HTTP endpoints: custom slash commands
(``application/x-www-form-urlencoded``) and interactive button actions (JSON POSTed to the
button's ``integration.url`` with its ``context``).

Reactions (``POST /reactions``, ``DELETE /users/{id}/posts/{id}/reactions/{emoji}``) and bot
accounts (``GET /users/{id}``: ``is_bot``; the server marks their posts ``props.from_bot``) are
served as the real server does. The server's rate limiter is on, with Mattermost's defaults
(``RateLimitSettings``: 10 requests per second per user, a burst of 100): beyond it a call is
answered 429 with ``Retry-After`` and ``X-Ratelimit-*``, and every call that arrives while a
``Retry-After`` still runs is marked (:attr:`Call.inside_retry_after`).

Faults are chosen per request by rules the test sets (:meth:`FakeMattermost.add_fault`): a
status (429 with ``Retry-After`` and ``X-Ratelimit-*`` as the server's rate limiter sends them,
or 500 / 503 with a JSON error body) with a probability or for the next N matching calls, and
latency per endpoint (:meth:`FakeMattermost.add_latency`: a slow server). The
websocket can be dropped every N ``posted`` events, dropped on command, or made half-open
(:meth:`go_silent`: no more frames, pings ignored). Every call is recorded with the fake's own
timestamps (:attr:`calls`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import secrets
import ssl
import string
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import aiohttp
from aiohttp import web

MAX_POST_SIZE = 16383
REQUEST_ID = web.RequestKey("request_id", str)
USER_ID = web.RequestKey("user_id", str)


def new_id() -> str:
    """A 26-character Mattermost id (lowercase base32-like)."""
    alphabet = string.ascii_lowercase + "13456789"
    return "".join(secrets.choice(alphabet) for _ in range(26))


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Call:
    """One REST call the fake received."""

    method: str
    path: str
    status: int
    started: float
    """``time.monotonic()`` when the request arrived."""
    finished: float
    body: Any
    query: dict[str, str]
    request_id: str
    fault: bool = False
    limited: bool = False
    """Answered 429 by the server's rate limiter (not an injected fault)."""
    inside_retry_after: bool = False
    """Arrived while a ``Retry-After`` the server gave this user was still running."""
    window_from: float | None = None
    """When that ``Retry-After`` window began (the arrival of the call answered 429)."""


@dataclass
class Fault:
    """Answer matching calls with an error instead of serving them."""

    method: str
    path: str
    """Regular expression matched against the path (full match)."""
    status: int
    probability: float = 1.0
    remaining: int | None = None
    """Stop after this many injected faults (``None``: forever)."""
    retry_after: float = 1.0
    after: bool = False
    """Serve the request first, then answer with the error (the client cannot know it worked)."""
    rng: random.Random = field(default_factory=lambda: random.Random(7))


@dataclass
class WsConn:
    ws: web.WebSocketResponse
    user_id: str | None = None
    seq: int = 0
    silent: bool = False
    posted_sent: int = 0
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    record: dict[str, Any] = field(default_factory=dict)


class FakeMattermost:
    """The fake server; ``async with FakeMattermost() as mm: mm.host, mm.port``."""

    def __init__(
        self,
        *,
        bot_token: str = "bot-token",
        max_post_size: int | None = MAX_POST_SIZE,
        ssl_context: ssl.SSLContext | None = None,
        rate_limit: tuple[float, int] | None = (10.0, 100),
    ) -> None:
        """``rate_limit``: the server's ``(PerSec, MaxBurst)`` per user (``None``: off)."""
        self.ssl_context = ssl_context
        """Serve HTTPS / WSS with this context (``None``: plain HTTP)."""
        self.team_id = new_id()
        self.users: dict[str, dict[str, Any]] = {}
        self.tokens: dict[str, str] = {}
        self.channels: dict[str, dict[str, Any]] = {}
        self.members: dict[str, set[str]] = {}
        self.posts: dict[str, dict[str, Any]] = {}
        self.ephemeral: list[dict[str, Any]] = []
        self.files: dict[str, dict[str, Any]] = {}
        """Uploaded files by id: their ``FileInfo`` plus ``data`` (the bytes)."""
        self.command_responses: list[dict[str, Any]] = []
        self.calls: list[Call] = []
        self.faults: list[Fault] = []
        self.latency: list[tuple[str, str, float]] = []
        """``(method, path regex, seconds)``: matching calls are served this much later."""
        self._closing = asyncio.Event()
        self.max_post_size = max_post_size
        self.drop_every: int | None = None
        self.ws_conns: list[WsConn] = []
        self.ws_connects = 0
        self.ws_drops = 0
        self.rate_limit = rate_limit
        self._gcra: dict[str, float] = {}
        self._limited_until: dict[str, float] = {}
        self._limited_from: dict[str, float] = {}
        self.reactions: dict[str, list[dict[str, Any]]] = {}
        """post id -> reactions on it."""
        self.reaction_log: list[tuple[float, str, str, str]] = []
        """``(monotonic, "add" | "remove", post id, emoji)`` of every reaction call that took effect."""
        self.ws_log: list[dict[str, Any]] = []
        """Every websocket: ``authenticated_at``, ``stalled_at``, ``closed_at`` (monotonic)."""
        self._pending_ids: dict[str, str] = {}
        self._command_urls: dict[str, dict[str, Any]] = {}
        self.bot_user_id = self.add_user("opsbot", is_bot=True, token=bot_token)
        self.changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self.host = "127.0.0.1"
        self.port = 0
        self._session: aiohttp.ClientSession | None = None

    # -- lifecycle ----------------------------------------------------------------------------
    async def __aenter__(self) -> FakeMattermost:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        app = web.Application(middlewares=[self._middleware])
        api = "/api/v4"
        app.router.add_get(f"{api}/websocket", self._ws)
        app.router.add_get(f"{api}/users/me", self._users_me)
        app.router.add_get(f"{api}/users/{{user_id}}", self._get_user)
        app.router.add_get(f"{api}/users/me/teams", self._my_teams)
        app.router.add_get(f"{api}/users/me/teams/{{team_id}}/channels", self._my_channels)
        app.router.add_get(f"{api}/channels/{{channel_id}}", self._get_channel)
        app.router.add_get(f"{api}/channels/{{channel_id}}/posts", self._channel_posts)
        app.router.add_post(f"{api}/posts", self._create_post)
        app.router.add_post(f"{api}/posts/ephemeral", self._create_ephemeral)
        app.router.add_get(f"{api}/posts/{{post_id}}", self._get_post)
        app.router.add_put(f"{api}/posts/{{post_id}}/patch", self._patch_post)
        app.router.add_get(f"{api}/posts/{{post_id}}/thread", self._get_thread)
        app.router.add_post(f"{api}/files", self._upload_files)
        app.router.add_get(f"{api}/config/client", self._client_config)
        app.router.add_post(f"{api}/reactions", self._save_reaction)
        app.router.add_delete(
            f"{api}/users/{{user_id}}/posts/{{post_id}}/reactions/{{emoji}}", self._delete_reaction
        )
        app.router.add_post("/hooks/commands/{hook_id}", self._command_response_url)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0, ssl_context=self.ssl_context)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._session = aiohttp.ClientSession()

    async def close(self) -> None:
        self._closing.set()
        for conn in list(self.ws_conns):
            with contextlib.suppress(Exception):
                await conn.ws.close()
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def url(self) -> str:
        scheme = "https" if self.ssl_context else "http"
        return f"{scheme}://{self.host}:{self.port}"

    def settings_kwargs(self) -> dict[str, Any]:
        """MattermostSettings fields that point a client at this fake."""
        return {
            "url": self.host,
            "scheme": "https" if self.ssl_context else "http",
            "port": self.port,
            "token": self.tokens_for(self.bot_user_id),
        }

    def tokens_for(self, user_id: str) -> str:
        return next(t for t, u in self.tokens.items() if u == user_id)

    # -- world building -------------------------------------------------------------------------
    def add_user(self, username: str, *, is_bot: bool = False, token: str | None = None) -> str:
        uid = new_id()
        self.users[uid] = {
            "id": uid,
            "username": username,
            "is_bot": is_bot,
            "roles": "system_user",
            "create_at": now_ms(),
            "update_at": now_ms(),
            "delete_at": 0,
            "email": f"{username}@example.com",
            "nickname": "",
            "first_name": "",
            "last_name": "",
            "locale": "en",
        }
        self.tokens[token or secrets.token_hex(13)] = uid
        return uid

    def add_channel(self, name: str, members: list[str], *, type: str = "O") -> str:
        cid = new_id()
        self.channels[cid] = {
            "id": cid,
            "create_at": now_ms(),
            "update_at": now_ms(),
            "delete_at": 0,
            "team_id": self.team_id if type in ("O", "P") else "",
            "type": type,
            "display_name": name,
            "name": name,
            "header": "",
            "purpose": "",
            "last_post_at": 0,
            "total_msg_count": 0,
            "creator_id": members[0] if members else "",
        }
        self.members[cid] = set(members)
        return cid

    def add_dm(self, user_id: str) -> str:
        a, b = sorted([user_id, self.bot_user_id])
        cid = self.add_channel(f"{a}__{b}", [user_id, self.bot_user_id], type="D")
        return cid

    def add_fault(
        self,
        method: str,
        path: str,
        status: int,
        *,
        probability: float = 1.0,
        count: int | None = None,
        retry_after: float = 1.0,
        after: bool = False,
        seed: int = 7,
    ) -> Fault:
        fault = Fault(method, path, status, probability, count, retry_after, after, random.Random(seed))
        self.faults.append(fault)
        return fault

    def add_latency(self, method: str, path: str, seconds: float) -> None:
        """Serve every ``method`` call whose path fully matches ``path`` ``seconds`` late (after the
        rate limiter and faults were decided, as a slow database behind the server would)."""
        self.latency.append((method, path, seconds))

    # -- what users do --------------------------------------------------------------------------
    async def user_posts(
        self,
        user_id: str,
        channel_id: str,
        message: str,
        *,
        root_id: str = "",
        props: dict[str, Any] | None = None,
        type: str = "",
        mark_bot: bool = True,
    ) -> dict[str, Any]:
        """A user (or another bot) posts: stored, then broadcast as ``posted`` to members.

        ``mark_bot=False``: a bot account's post without ``props.from_bot`` (plugins and older
        servers create such posts; only ``GET /users/{id}`` tells)."""
        post = self._store_post(
            user_id, channel_id, message, root_id=root_id, props=props, type=type, mark_bot=mark_bot
        )
        await self._broadcast_posted(post)
        return post

    async def user_edits(self, post_id: str, message: str) -> dict[str, Any]:
        post = self.posts[post_id]
        post["message"] = message
        post["edit_at"] = post["update_at"] = now_ms()
        await self._broadcast("post_edited", {"post": json.dumps(post)}, post["channel_id"], exclude=None)
        return post

    async def send_slash_command(
        self, url: str, *, token: str, user_id: str, channel_id: str, text: str, command: str = "/rca"
    ) -> tuple[int, Any, float]:
        """POST a custom slash command to ``url`` as Mattermost does; (status, body, seconds)."""
        assert self._session is not None
        hook = new_id()
        user = self.users[user_id]
        channel = self.channels[channel_id]
        self._command_urls[hook] = {"user_id": user_id, "channel_id": channel_id}
        form = {
            "channel_id": channel_id,
            "channel_name": channel["name"],
            "command": command,
            "response_url": f"{self.url}/hooks/commands/{hook}",
            "team_domain": "ops",
            "team_id": self.team_id,
            "text": text,
            "token": token,
            "trigger_id": secrets.token_urlsafe(60),
            "user_id": user_id,
            "user_name": user["username"],
        }
        started = time.monotonic()
        async with self._session.post(
            url,
            data=urlencode(form),
            headers={
                "Content-Type": "application/x-www-form-urlencoded",
                "Accept": "application/json",
                "Authorization": f"Token {token}",
                "User-Agent": "Mattermost-Bot/1.1",
            },
        ) as resp:
            raw = await resp.read()
            elapsed = time.monotonic() - started
            body: Any = json.loads(raw) if raw and resp.content_type == "application/json" else raw.decode()
            if resp.status == 200 and isinstance(body, dict):
                await self._apply_command_response(user_id, channel_id, body)
            return resp.status, body, elapsed

    async def click_button(self, post_id: str, action_name: str, user_id: str) -> tuple[int, Any]:
        """A user clicks a message button: POST the action request to its integration URL."""
        assert self._session is not None
        post = self.posts[post_id]
        for att in post.get("props", {}).get("attachments", []):
            for action in att.get("actions", []):
                if action.get("name") == action_name or action.get("id") == action_name:
                    integration = action["integration"]
                    channel = self.channels[post["channel_id"]]
                    request = {
                        "user_id": user_id,
                        "user_name": self.users[user_id]["username"],
                        "channel_id": post["channel_id"],
                        "channel_name": channel["name"],
                        "team_id": self.team_id,
                        "team_domain": "ops",
                        "post_id": post_id,
                        "trigger_id": secrets.token_urlsafe(40),
                        "type": "",
                        "data_source": "",
                        "context": integration.get("context", {}),
                    }
                    async with self._session.post(integration["url"], json=request) as resp:
                        raw = await resp.read()
                        ok = raw and resp.content_type == "application/json"
                        return resp.status, json.loads(raw) if ok else raw.decode()
        raise KeyError(f"no action {action_name!r} on post {post_id}")

    # -- websocket control ----------------------------------------------------------------------
    async def drop_websockets(self) -> None:
        """Close every websocket abruptly (the TCP connection goes away)."""
        for conn in list(self.ws_conns):
            self.ws_drops += 1
            conn.silent = True
            with contextlib.suppress(Exception):
                await conn.ws.close(code=aiohttp.WSCloseCode.GOING_AWAY)
            conn.closed.set()

    def go_silent(self) -> None:
        """Half-open: current sockets get no more frames and their pings go unanswered."""
        for conn in self.ws_conns:
            if not conn.silent:
                conn.silent = True
                conn.record["stalled_at"] = time.monotonic()

    # -- queries for tests ----------------------------------------------------------------------
    def bot_posts(self, channel_id: str | None = None) -> list[dict[str, Any]]:
        return [
            p
            for p in self.posts.values()
            if p["user_id"] == self.bot_user_id and (channel_id is None or p["channel_id"] == channel_id)
        ]

    def thread(self, root_id: str) -> list[dict[str, Any]]:
        posts = [p for p in self.posts.values() if p["id"] == root_id or p["root_id"] == root_id]
        return sorted(posts, key=lambda p: p["create_at"])

    def calls_to(self, method: str, path_re: str) -> list[Call]:
        pat = re.compile(path_re)
        return [c for c in self.calls if c.method == method and pat.fullmatch(c.path)]

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        """Wait until ``predicate()`` holds (re-checked on every change), or fail at the deadline."""

        async def _wait() -> None:
            async with self.changed:
                await self.changed.wait_for(predicate)

        try:
            await asyncio.wait_for(_wait(), timeout)
        except TimeoutError:
            raise AssertionError(f"condition not met within {timeout} s") from None

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    # -- plumbing -------------------------------------------------------------------------------
    def _error(self, status: int, error_id: str, message: str, request_id: str) -> web.Response:
        body = {
            "id": error_id,
            "message": message,
            "detailed_error": "",
            "request_id": request_id,
            "status_code": status,
        }
        return web.Response(
            status=status,
            body=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "X-Request-Id": request_id},
        )

    def _json(self, data: Any, request_id: str, status: int = 200) -> web.Response:
        return web.Response(
            status=status,
            body=json.dumps(data).encode(),
            headers={"Content-Type": "application/json", "X-Request-Id": request_id},
        )

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
        started = time.monotonic()
        request_id = new_id()
        request[REQUEST_ID] = request_id
        path = request.path
        body: Any = None
        if request.can_read_body and request.content_type == "application/json":
            body = await request.json()
        if path.endswith("/websocket") or path.startswith("/hooks/"):
            resp: web.StreamResponse = await handler(request)
            return resp
        user_key = request.headers.get("Authorization", "") or request.cookies.get("MMAUTHTOKEN", "")
        inside = started < self._limited_until.get(user_key, -1.0)
        window_from = self._limited_from.get(user_key) if inside else None
        wait = self._throttle(user_key, started)
        fault = self._match_fault(request.method, path) if wait <= 0 else None
        is_fault = False
        limited = wait > 0
        delay = max(
            (d for m, p, d in self.latency if m == request.method and re.fullmatch(p, path)), default=0
        )
        if delay:  # cut short when the server closes (a slow call must not hold up its shutdown)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), delay)
        if limited:
            resp = self._limit_response(wait, request_id)
            self._limit(user_key, started, float(resp.headers["Retry-After"]))
        elif fault is not None and not fault.after:
            resp = self._fault_response(fault, request_id)
            is_fault = True
            if fault.status == 429:  # the limiter's Retry-After counts for every call of the user
                self._limit(user_key, started, fault.retry_after)
        else:
            user = self._auth(request)
            if user is None:
                resp = self._error(
                    401,
                    "api.context.session_expired.app_error",
                    "Invalid or expired session, please login again.",
                    request_id,
                )
            else:
                request[USER_ID] = user
                resp = await handler(request)
                if fault is not None:
                    resp = self._fault_response(fault, request_id)
                    is_fault = True
        self.calls.append(
            Call(
                request.method,
                path,
                resp.status,
                started,
                time.monotonic(),
                body,
                dict(request.query),
                request_id,
                is_fault,
                limited,
                inside,
                window_from,
            )
        )
        await self._notify()
        return resp

    def _limit(self, user_key: str, at: float, retry_after: float) -> None:
        if at + retry_after > self._limited_until.get(user_key, -1.0):
            if self._limited_until.get(user_key, -1.0) < at:
                self._limited_from[user_key] = at
            self._limited_until[user_key] = at + retry_after

    def _throttle(self, user_key: str, now: float) -> float:
        """Mattermost's limiter (throttled's GCRA): seconds until this user's call would conform."""
        if self.rate_limit is None:
            return 0.0
        per_sec, burst = self.rate_limit
        interval = 1.0 / per_sec
        tat = max(self._gcra.get(user_key, now), now)
        if tat - now > burst * interval:
            return tat - now - burst * interval
        self._gcra[user_key] = tat + interval
        return 0.0

    def _limit_response(self, wait: float, request_id: str) -> web.Response:
        assert self.rate_limit is not None
        retry = max(1, int(wait + 0.999))  # throttled rounds the wait up to whole seconds
        return web.Response(
            status=429,
            text="limit exceeded\n",
            headers={
                "Retry-After": str(retry),
                "X-Ratelimit-Limit": str(int(self.rate_limit[0])),
                "X-Ratelimit-Remaining": "0",
                "X-Ratelimit-Reset": str(retry),
                "X-Request-Id": request_id,
            },
        )

    def _match_fault(self, method: str, path: str) -> Fault | None:
        for fault in self.faults:
            if fault.method != method or not re.fullmatch(fault.path, path):
                continue
            if fault.remaining is not None and fault.remaining <= 0:
                continue
            if fault.rng.random() < fault.probability:
                if fault.remaining is not None:
                    fault.remaining -= 1
                return fault
        return None

    def _fault_response(self, fault: Fault, request_id: str) -> web.Response:
        if fault.status == 429:
            # Mattermost's rate limiter (throttled) answers in plain text with these headers.
            reset = max(1, round(fault.retry_after))
            return web.Response(
                status=429,
                text="limit exceeded\n",
                headers={
                    "Retry-After": f"{fault.retry_after:g}",
                    "X-Ratelimit-Limit": "10",
                    "X-Ratelimit-Remaining": "0",
                    "X-Ratelimit-Reset": str(reset),
                    "X-Request-Id": request_id,
                },
            )
        return self._error(
            fault.status, "app.fake.injected.app_error", "We encountered an error.", request_id
        )

    def _auth(self, request: web.Request) -> str | None:
        header = request.headers.get("Authorization", "")
        token = header.removeprefix("Bearer ").removeprefix("BEARER ").strip() if header else ""
        if not token:
            token = request.cookies.get("MMAUTHTOKEN", "")
        return self.tokens.get(token)

    # -- REST handlers --------------------------------------------------------------------------
    async def _users_me(self, request: web.Request) -> web.Response:
        return self._json(self.users[request[USER_ID]], request[REQUEST_ID])

    async def _get_user(self, request: web.Request) -> web.Response:
        user = self.users.get(request.match_info["user_id"])
        if user is None:
            return self._error(
                404, "app.user.missing_account.const", "Unable to find the user.", request[REQUEST_ID]
            )
        return self._json(user, request[REQUEST_ID])

    async def _my_teams(self, request: web.Request) -> web.Response:
        team = {
            "id": self.team_id,
            "name": "ops",
            "display_name": "Ops",
            "type": "O",
            "create_at": 0,
            "update_at": 0,
            "delete_at": 0,
        }
        return self._json([team], request[REQUEST_ID])

    async def _my_channels(self, request: web.Request) -> web.Response:
        me = request[USER_ID]
        # As the real server does, DMs and group messages come with every team's list.
        chans = [c for cid, c in self.channels.items() if me in self.members[cid]]
        return self._json(chans, request[REQUEST_ID])

    async def _get_channel(self, request: web.Request) -> web.Response:
        cid = request.match_info["channel_id"]
        if cid not in self.channels or request[USER_ID] not in self.members[cid]:
            return self._error(
                403,
                "api.context.permissions.app_error",
                "You do not have the appropriate permissions.",
                request[REQUEST_ID],
            )
        return self._json(self.channels[cid], request[REQUEST_ID])

    async def _channel_posts(self, request: web.Request) -> web.Response:
        cid = request.match_info["channel_id"]
        if cid not in self.channels or request[USER_ID] not in self.members[cid]:
            return self._error(
                403,
                "api.context.permissions.app_error",
                "You do not have the appropriate permissions.",
                request[REQUEST_ID],
            )
        since = int(request.query.get("since", "0") or 0)
        posts = [p for p in self.posts.values() if p["channel_id"] == cid]
        if since:
            # GetPostsSince: every post created, edited or deleted after ``since``.
            posts = [p for p in posts if p["update_at"] > since]
        else:
            page = int(request.query.get("page", "0"))
            per_page = int(request.query.get("per_page", "60"))
            posts = sorted(posts, key=lambda p: p["create_at"], reverse=True)
            posts = posts[page * per_page : (page + 1) * per_page]
        posts = sorted(posts, key=lambda p: p["create_at"], reverse=True)
        body = {
            "order": [p["id"] for p in posts],
            "posts": {p["id"]: p for p in posts},
            "next_post_id": "",
            "prev_post_id": "",
            "has_next": False,
        }
        return self._json(body, request[REQUEST_ID])

    async def _create_post(self, request: web.Request) -> web.Response:
        rid = request[REQUEST_ID]
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return self._error(
                400,
                "api.context.invalid_body_param.app_error",
                "Invalid or missing post in request body.",
                rid,
            )
        cid = body.get("channel_id", "")
        if cid not in self.channels:
            return self._error(
                400,
                "api.context.invalid_body_param.app_error",
                "Invalid or missing channel_id in request body.",
                rid,
            )
        if request[USER_ID] not in self.members[cid]:
            return self._error(
                403, "api.context.permissions.app_error", "You do not have the appropriate permissions.", rid
            )
        message = body.get("message", "")
        if self.max_post_size is not None and len(message) > self.max_post_size:
            return self._error(400, "model.post.is_valid.msg.app_error", "Invalid Message.", rid)
        pending = body.get("pending_post_id") or ""
        if pending and pending in self._pending_ids:
            # The server's duplicate-create check: the same pending_post_id returns the first post.
            return self._json(self.posts[self._pending_ids[pending]], rid, 201)
        post = self._store_post(
            request[USER_ID],
            cid,
            message,
            root_id=body.get("root_id", ""),
            props=body.get("props"),
            pending_post_id=pending,
        )
        if pending:
            self._pending_ids[pending] = post["id"]
        self._attach_files(post, body.get("file_ids"), request[USER_ID])
        await self._broadcast_posted(post)
        return self._json(post, rid, 201)

    async def _create_ephemeral(self, request: web.Request) -> web.Response:
        rid = request[REQUEST_ID]
        body = await request.json()
        post = dict(body.get("post", {}))
        post.update(id=new_id(), create_at=now_ms(), user_id=request[USER_ID], type="system_ephemeral")
        self.ephemeral.append({"user_id": body.get("user_id"), "post": post})
        return self._json(post, rid, 201)

    async def _get_post(self, request: web.Request) -> web.Response:
        post = self.posts.get(request.match_info["post_id"])
        if post is None:
            return self._error(404, "app.post.get.app_error", "Unable to get the post.", request[REQUEST_ID])
        return self._json(post, request[REQUEST_ID])

    async def _patch_post(self, request: web.Request) -> web.Response:
        rid = request[REQUEST_ID]
        post = self.posts.get(request.match_info["post_id"])
        if post is None:
            return self._error(404, "app.post.get.app_error", "Unable to get the post.", rid)
        if post["user_id"] != request[USER_ID]:
            return self._error(
                403, "api.context.permissions.app_error", "You do not have the appropriate permissions.", rid
            )
        body = await request.json()
        if "message" in body:
            if self.max_post_size is not None and len(body["message"]) > self.max_post_size:
                return self._error(400, "model.post.is_valid.msg.app_error", "Invalid Message.", rid)
            post["message"] = body["message"]
        if "props" in body:
            post["props"] = body["props"] or {}
        post["edit_at"] = post["update_at"] = now_ms()
        post.setdefault("edits", []).append(time.monotonic())
        await self._broadcast("post_edited", {"post": json.dumps(post)}, post["channel_id"], exclude=None)
        return self._json(post, rid)

    async def _save_reaction(self, request: web.Request) -> web.Response:
        rid = request[REQUEST_ID]
        body = await request.json()
        if not isinstance(body, dict) or body.get("user_id") != request[USER_ID]:
            return self._error(
                403, "api.context.permissions.app_error", "You do not have the appropriate permissions.", rid
            )
        post = self.posts.get(str(body.get("post_id", "")))
        emoji = str(body.get("emoji_name", ""))
        if post is None or request[USER_ID] not in self.members[post["channel_id"]]:
            return self._error(
                403, "api.context.permissions.app_error", "You do not have the appropriate permissions.", rid
            )
        if not re.fullmatch(r"[a-zA-Z0-9_+-]{1,64}", emoji):
            return self._error(
                400, "model.reaction.is_valid.emoji_name.app_error", "Invalid emoji name.", rid
            )
        reaction = {
            "user_id": request[USER_ID],
            "post_id": post["id"],
            "emoji_name": emoji,
            "create_at": now_ms(),
        }
        existing = self.reactions.setdefault(post["id"], [])
        if not any(r["user_id"] == reaction["user_id"] and r["emoji_name"] == emoji for r in existing):
            existing.append(reaction)  # the server saves a repeated reaction once
            self.reaction_log.append((time.monotonic(), "add", post["id"], emoji))
        return self._json(reaction, rid)

    async def _delete_reaction(self, request: web.Request) -> web.Response:
        rid = request[REQUEST_ID]
        user, post_id, emoji = (request.match_info[k] for k in ("user_id", "post_id", "emoji"))
        if user != request[USER_ID]:
            return self._error(
                403, "api.context.permissions.app_error", "You do not have the appropriate permissions.", rid
            )
        existing = self.reactions.get(post_id, [])
        kept = [r for r in existing if not (r["user_id"] == user and r["emoji_name"] == emoji)]
        if len(kept) != len(existing):
            self.reactions[post_id] = kept
            self.reaction_log.append((time.monotonic(), "remove", post_id, emoji))
        return self._json({"status": "OK"}, rid)

    def reaction_names(self, post_id: str) -> list[str]:
        """Emoji on ``post_id`` now, in the order they were added."""
        return [r["emoji_name"] for r in self.reactions.get(post_id, [])]

    async def _get_thread(self, request: web.Request) -> web.Response:
        """``GET /posts/{id}/thread`` as the server's store reads it: the post asked for first, then
        the thread's posts (root and replies) in ``direction`` order (``up``: newest first) after
        ``fromCreateAt`` / ``fromPost``, ``perPage`` of them (at most 200), ``has_next`` when more."""
        rid = request[REQUEST_ID]
        asked = self.posts.get(request.match_info["post_id"])
        if asked is None or asked.get("delete_at"):
            return self._error(404, "app.post.get.app_error", "Unable to get the post.", rid)
        if request[USER_ID] not in self.members.get(asked["channel_id"], set()):
            return self._error(
                403, "api.context.permissions.app_error", "You do not have the appropriate permissions.", rid
            )
        query = request.query
        try:
            per_page = int(query.get("perPage") or 0)
            from_create_at = int(query.get("fromCreateAt") or 0)
        except ValueError:
            return self._error(
                400,
                "api.context.invalid_url_param.app_error",
                "Invalid or missing parameter in request URL.",
                rid,
            )
        from_post = query.get("fromPost", "")
        direction = query.get("direction", "")
        if (
            per_page > 200
            or per_page < 0
            or direction not in ("", "up", "down")
            or (from_post and not from_create_at)
        ):
            return self._error(
                400,
                "api.context.invalid_url_param.app_error",
                "Invalid or missing parameter in request URL.",
                rid,
            )
        posts = [p for p in self.thread(asked["root_id"] or asked["id"]) if not p.get("delete_at")]
        key = lambda p: (p["create_at"], p["id"])  # noqa: E731 - the store's ORDER BY CreateAt, Id
        if direction == "up":
            posts.sort(key=key, reverse=True)
            if from_create_at:
                posts = [p for p in posts if key(p) < (from_create_at, from_post or "")]
        elif direction == "down" and from_create_at:
            posts = [p for p in sorted(posts, key=key) if key(p) > (from_create_at, from_post or "\uffff")]
        has_next = bool(per_page) and len(posts) > per_page
        if per_page:
            posts = posts[:per_page]
        order = [asked["id"]] + [p["id"] for p in posts if p["id"] != asked["id"]]
        body = {
            "order": order,
            "posts": {asked["id"]: asked, **{p["id"]: p for p in posts}},
            "next_post_id": "",
            "prev_post_id": "",
            "has_next": has_next,
            "first_inaccessible_post_time": 0,
        }
        return self._json(body, rid)

    async def _upload_files(self, request: web.Request) -> web.Response:
        """``POST /files``, multipart: the ``channel_id`` field, then one or more ``files`` parts."""
        rid = request[REQUEST_ID]
        if not request.content_type.startswith("multipart/"):
            return self._error(
                400,
                "api.file.upload_file.incorrect_content_type.app_error",
                "Unable to upload file(s). Invalid content type.",
                rid,
            )
        reader = await request.multipart()
        channel_id = ""
        infos: list[dict[str, Any]] = []
        while True:
            part = await reader.next()
            if part is None:
                break
            if not isinstance(part, aiohttp.BodyPartReader):
                continue
            if part.name == "channel_id":
                channel_id = (await part.read()).decode()
                continue
            if part.name != "files" or not part.filename:
                continue
            if channel_id not in self.channels:
                return self._error(
                    400,
                    "api.file.upload_file.incorrect_number_of_files.app_error",
                    "Invalid or missing channel_id.",
                    rid,
                )
            if request[USER_ID] not in self.members[channel_id]:
                return self._error(
                    403,
                    "api.context.permissions.app_error",
                    "You do not have the appropriate permissions.",
                    rid,
                )
            data = bytes(await part.read())
            name = part.filename
            info = {
                "id": new_id(),
                "user_id": request[USER_ID],
                "channel_id": channel_id,
                "post_id": "",
                "create_at": now_ms(),
                "update_at": now_ms(),
                "delete_at": 0,
                "name": name,
                "extension": name.rsplit(".", 1)[-1] if "." in name else "",
                "size": len(data),
                "mime_type": part.headers.get("Content-Type", "application/octet-stream"),
            }
            self.files[info["id"]] = {**info, "data": data}
            infos.append(info)
        if not infos:
            return self._error(
                400,
                "api.file.upload_file.incorrect_number_of_files.app_error",
                "Unable to upload files. Incorrect number of files specified.",
                rid,
            )
        await self._notify()
        return self._json({"file_infos": infos, "client_ids": []}, rid, 201)

    def _attach_files(self, post: dict[str, Any], file_ids: object, user_id: str) -> None:
        """Files of a new post: only the poster's own uploads to that channel not yet on a post
        are attached (the server drops the others with a log line, not an error)."""
        if not isinstance(file_ids, list):
            return
        attached = []
        for file_id in file_ids:
            file = self.files.get(str(file_id))
            if (
                file
                and file["user_id"] == user_id
                and file["channel_id"] == post["channel_id"]
                and not file["post_id"]
            ):
                file["post_id"] = post["id"]
                attached.append({k: v for k, v in file.items() if k != "data"})
        if attached:
            post["file_ids"] = [f["id"] for f in attached]
            post["metadata"] = {**post.get("metadata", {}), "files": attached}

    async def _client_config(self, request: web.Request) -> web.Response:
        if request.query.get("format") != "old":
            return self._error(
                501,
                "api.config.client.old_format.app_error",
                "New format for the client configuration is not supported yet.",
                request[REQUEST_ID],
            )
        config = {
            "Version": "9.11.0",
            "BuildNumber": "9.11.0",
            "SiteName": "Mattermost",
            "EnableCommands": "true",
        }
        if self.max_post_size is not None:
            config["MaxPostSize"] = str(self.max_post_size)
        return self._json(config, request[REQUEST_ID])

    async def _command_response_url(self, request: web.Request) -> web.Response:
        hook = self._command_urls.get(request.match_info["hook_id"])
        if hook is None:
            return self._error(404, "web.incoming_webhook.invalid.app_error", "Invalid webhook.", "")
        body = await request.json()
        # Recorded so tests can check that no bot token is sent to a response URL.
        body["_authorization"] = request.headers.get("Authorization")
        await self._apply_command_response(hook["user_id"], hook["channel_id"], body)
        await self._notify()
        return web.Response(text="ok", content_type="text/plain")

    async def _apply_command_response(self, user_id: str, channel_id: str, body: dict[str, Any]) -> None:
        record = {"user_id": user_id, "channel_id": channel_id, **body}
        self.command_responses.append(record)
        if body.get("response_type") == "in_channel" and body.get("text"):
            await self.user_posts(self.bot_user_id, channel_id, body["text"])

    # -- posts and events -----------------------------------------------------------------------
    def _store_post(
        self,
        user_id: str,
        channel_id: str,
        message: str,
        *,
        root_id: str = "",
        props: dict[str, Any] | None = None,
        type: str = "",
        pending_post_id: str = "",
        mark_bot: bool = True,
    ) -> dict[str, Any]:
        ts = now_ms()
        # create_at is unique and increasing per server, as clients rely on for paging.
        last = max((p["create_at"] for p in self.posts.values()), default=0)
        ts = max(ts, last + 1)
        post = {
            "id": new_id(),
            "create_at": ts,
            "update_at": ts,
            "edit_at": 0,
            "delete_at": 0,
            "is_pinned": False,
            "user_id": user_id,
            "channel_id": channel_id,
            "root_id": root_id,
            "original_id": "",
            "message": message,
            "type": type,
            "props": props or {},
            "hashtags": "",
            "pending_post_id": pending_post_id,
            "reply_count": 0,
            "metadata": {},
        }
        if mark_bot and self.users.get(user_id, {}).get("is_bot") and user_id != self.bot_user_id:
            post["props"].setdefault("from_bot", "true")
        self.posts[post["id"]] = post
        self.channels[channel_id]["last_post_at"] = ts
        return post

    async def _broadcast_posted(self, post: dict[str, Any]) -> None:
        channel = self.channels[post["channel_id"]]
        mentioned = [uid for uid, u in self.users.items() if f"@{u['username']}" in post["message"]]
        data: dict[str, Any] = {
            "channel_display_name": channel["display_name"],
            "channel_name": channel["name"],
            "channel_type": channel["type"],
            "post": json.dumps(post),
            "sender_name": "@" + self.users[post["user_id"]]["username"],
            "set_online": True,
            "team_id": channel["team_id"],
        }
        if mentioned:
            data["mentions"] = json.dumps(mentioned)
        await self._broadcast("posted", data, post["channel_id"], exclude=None, count_posted=True)
        await self._notify()

    async def _broadcast(
        self,
        event: str,
        data: dict[str, Any],
        channel_id: str,
        *,
        exclude: str | None,
        count_posted: bool = False,
    ) -> None:
        members = self.members[channel_id]
        for conn in list(self.ws_conns):
            if conn.silent or conn.user_id not in members or conn.ws.closed:
                continue
            frame = {
                "event": event,
                "data": data,
                "broadcast": {"omit_users": None, "user_id": "", "channel_id": channel_id, "team_id": ""},
                "seq": conn.seq,
            }
            conn.seq += 1
            try:
                await conn.ws.send_str(json.dumps(frame))
            except (ConnectionError, RuntimeError):
                continue
            if count_posted:
                conn.posted_sent += 1
                if self.drop_every and conn.posted_sent % self.drop_every == 0:
                    self.ws_drops += 1
                    conn.silent = True
                    # An abrupt drop: the TCP connection goes away without a close handshake.
                    transport = conn.ws._req.transport if conn.ws._req is not None else None
                    if transport is not None:
                        transport.abort()
                    conn.closed.set()

    async def _ws(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(autoping=False)
        await ws.prepare(request)
        conn = WsConn(ws)
        conn.record = {"opened_at": time.monotonic(), "authenticated_at": None, "stalled_at": None}
        self.ws_log.append(conn.record)
        self.ws_conns.append(conn)
        self.ws_connects += 1
        try:
            async for msg in ws:
                if conn.silent:
                    continue  # half-open: nothing gets through either way
                if msg.type == aiohttp.WSMsgType.PING:
                    await ws.pong(msg.data)
                    continue
                if msg.type != aiohttp.WSMsgType.TEXT:
                    continue
                try:
                    frame = json.loads(msg.data)
                except json.JSONDecodeError:
                    continue
                action = frame.get("action")
                seq = frame.get("seq")
                if action == "authentication_challenge":
                    user = self.tokens.get(str(frame.get("data", {}).get("token", "")))
                    if user is None:
                        await ws.send_str(
                            json.dumps(
                                {
                                    "status": "FAIL",
                                    "seq_reply": seq,
                                    "error": {
                                        "id": "api.web_socket_router.not_authenticated.app_error",
                                        "message": "No authentication.",
                                        "status_code": 401,
                                    },
                                }
                            )
                        )
                        await ws.close()
                        break
                    conn.user_id = user
                    conn.record["authenticated_at"] = time.monotonic()
                    hello = {
                        "event": "hello",
                        "data": {
                            "server_version": "9.11.0.9.11.0.abc.true",
                            "connection_id": str(uuid.uuid4()),
                        },
                        "broadcast": {"omit_users": None, "user_id": user, "channel_id": "", "team_id": ""},
                        "seq": conn.seq,
                    }
                    conn.seq += 1
                    await ws.send_str(json.dumps(hello))
                    await ws.send_str(json.dumps({"status": "OK", "seq_reply": seq}))
                    await self._notify()
                elif action == "ping":
                    await ws.send_str(
                        json.dumps(
                            {
                                "status": "OK",
                                "seq_reply": seq,
                                "data": {"text": "pong", "version": "9.11.0", "server_time": now_ms()},
                            }
                        )
                    )
        finally:
            conn.record["closed_at"] = time.monotonic()
            conn.closed.set()
            with contextlib.suppress(ValueError):
                self.ws_conns.remove(conn)
            await self._notify()
        return ws

    def live_connections(self) -> int:
        return sum(1 for c in self.ws_conns if c.user_id and not c.silent and not c.ws.closed)
