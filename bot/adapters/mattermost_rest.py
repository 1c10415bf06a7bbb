"""Mattermost REST API v4 over aiohttp, under the one retry policy (:mod:`bot.retry`).

mattermostdriver's REST client makes blocking ``requests`` calls, which would stall the event
loop that streams every answer; this client speaks the same endpoints asynchronously. Errors
carry the server's error body (``id``, ``message``, ``request_id``, ``status_code``) and belong to
:mod:`bot.errors`' tree (:class:`MattermostAPIError` and its branch subclasses).

Every try first takes a slot of the bot account's rate budget (:mod:`bot.adapters.ratelimit`:
the server limits requests per user, 10 per second by default, and new posts per channel), in the
order of the caller's :class:`~bot.adapters.ratelimit.Ticket` (final answers first); a slot the
caller already waited for (``prepaid``) pays for the first try, and no try holds a slot while it
backs off. ``retry.deadline_s`` bounds the whole call, slot waits included.

Retries (``mattermost.retry``): a 429 waits ``Retry-After`` (else ``X-Ratelimit-Reset``), never
less, for as long as ``patience_s`` allows and without counting against ``max_retries``; the wait
holds every call of the bot account, since the server's limiter counts them all; 5xx and
connection errors back off exponentially with jitter up to ``max_retries`` times. ``POST /posts``
is retried safely because every create carries a ``pending_post_id``: the server answers a
repeated create with the post it already made instead of a second one.
"""

from __future__ import annotations

import asyncio
import json as jsonlib
import logging
import random
import ssl
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from bot.adapters.ratelimit import (
    ALL_CALLS,
    STALL_AFTER_S,
    BudgetStalled,
    BudgetTimeout,
    Permit,
    RateBudget,
)
from bot.config import MattermostSettings, RetrySettings
from bot.errors import (
    PlatformError,
    PlatformRejected,
    PlatformThrottled,
    PlatformUnavailable,
    platform_branch,
)
from bot.metrics import CHAT_API_RETRIES, count_chat_call
from bot.progress import note_progress
from bot.retry import RetriesExhausted, RetryBudget, retry_after_from_headers

logger = logging.getLogger(__name__)

PLATFORM = "mattermost"
DEFAULT_MAX_POST_SIZE = 16383
"""Runes a post may hold on servers since 5.0 (``PostMessageMaxRunesV2``)."""


class MattermostAPIError(PlatformError):
    """A REST call failed for good: an error status after retries, or one not worth retrying.

    Raised as one of its branch subclasses (:func:`mattermost_error`); catch this class for any.
    """

    def __init__(
        self,
        method: str,
        path: str,
        status: int | None,
        message: str,
        *,
        error_id: str | None = None,
        request_id: str | None = None,
    ) -> None:
        self.method = method
        self.path = path
        self.status = status
        self.error_id = error_id
        self.request_id = request_id
        self.message = message
        super().__init__(
            f"{method} {path}: {status if status is not None else 'no response'} "
            f"{error_id or ''} {message} (request_id={request_id or '-'})".replace("  ", " ")
        )

    def given_up(self, verdict: RetriesExhausted) -> MattermostAPIError:
        """This error as the branch the retry policy's verdict names (throttled / unavailable)."""
        return mattermost_error(
            self.method,
            self.path,
            self.status,
            f"{self.message} ({verdict})",
            error_id=self.error_id,
            request_id=self.request_id,
            exhausted=verdict.reason,
        )


class MattermostRejected(MattermostAPIError, PlatformRejected):
    """The server refused the call (4xx): retrying cannot help."""


class MattermostThrottled(MattermostAPIError, PlatformThrottled):
    """Still rate limited after ``mattermost.retry.patience_s``."""


class MattermostUnavailable(MattermostAPIError, PlatformUnavailable):
    """5xx, timeouts or connection errors after ``mattermost.retry.max_retries`` retries."""


_MM_BRANCH: dict[type[PlatformError], type[MattermostAPIError]] = {
    PlatformRejected: MattermostRejected,
    PlatformThrottled: MattermostThrottled,
    PlatformUnavailable: MattermostUnavailable,
}


def mattermost_error(
    method: str,
    path: str,
    status: int | None,
    message: str,
    *,
    error_id: str | None = None,
    request_id: str | None = None,
    exhausted: str | None = None,
) -> MattermostAPIError:
    """The :class:`MattermostAPIError` of the right branch for a failed call."""
    cls = _MM_BRANCH[platform_branch(http_status=status, exhausted=exhausted)]
    return cls(method, path, status, message, error_id=error_id, request_id=request_id)


def ssl_context(verify: bool) -> ssl.SSLContext | bool:
    """Verified TLS (system CAs) unless ``verify`` is false (then no certificate checks at all)."""
    if verify:
        return ssl.create_default_context()
    return False


def _metric_path(path: str) -> str:
    """``/posts/abc/patch`` -> ``/posts/{id}/patch``: bounded label values."""
    parts = [p if not (len(p) == 26 and p.isalnum()) else "{id}" for p in path.split("/")]
    return "/".join(parts)


def _call_outcome(status: int) -> str:
    """``opsbot_chat_api_calls_total``'s outcome of an HTTP status (the same words as Slack's)."""
    if status < 400:
        return "ok"
    if status == 429:
        return "ratelimited"
    return "server_error" if status >= 500 else "rejected"


class MattermostRest:
    """Async REST v4 client bound to one bot token."""

    def __init__(
        self,
        settings: MattermostSettings,
        *,
        rng: random.Random | None = None,
        budget: RateBudget | None = None,
    ) -> None:
        """``rng`` seeds the backoff jitter (tests); ``budget``: the bot account's rate budget
        (default: one built from ``settings``)."""
        self.settings = settings
        self.budget = budget or RateBudget(
            {ALL_CALLS: settings.rate_limit},
            channel_limits={"POST /posts": (settings.channel_post_interval_s, settings.channel_post_burst)},
            enabled=settings.rate_budgets,
            name=PLATFORM,
            stall_after_s=max(STALL_AFTER_S, 2 * settings.request_timeout_s),
        )
        self.base_url = f"{settings.scheme}://{settings.url}:{settings.port}{settings.basepath.rstrip('/')}"
        self.server_url = f"{settings.scheme}://{settings.url}:{settings.port}"
        self._token = settings.token.get_secret_value() if settings.token else ""
        self._session: aiohttp.ClientSession | None = None
        self._plain: aiohttp.ClientSession | None = None
        self._rng = rng or random.Random()

    async def start(self) -> None:
        """Open the HTTP session."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=ssl_context(self.settings.verify_tls)),
                timeout=aiohttp.ClientTimeout(total=self.settings.request_timeout_s),
                headers={"Authorization": f"Bearer {self._token}", "X-Requested-With": "XMLHttpRequest"},
            )
            # Slash command response URLs carry their own credentials: never send the bot token there.
            self._plain = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=ssl_context(self.settings.verify_tls)),
                timeout=aiohttp.ClientTimeout(total=self.settings.request_timeout_s),
            )

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._plain is not None:
            await self._plain.close()
            self._plain = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """The open session (after :meth:`start`)."""
        if self._session is None:
            raise RuntimeError("MattermostRest.start() was not called")
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, str] | None = None,
        url: str | None = None,
        retries: int | None = None,
        session: aiohttp.ClientSession | None = None,
        patience_s: float | None = None,
        max_wait_s: float | None = None,
        form: Callable[[], aiohttp.FormData] | None = None,
    ) -> Any:
        """Call ``method path`` (relative to the API base, or ``url``); return the decoded JSON.

        Retries under ``mattermost.retry`` (``retries`` / ``patience_s`` override its
        ``max_retries`` / ``patience_s`` for one call); raises :class:`MattermostAPIError` when the
        server refuses the call or the policy gives up (its ``deadline_s`` included), and
        :class:`~bot.adapters.ratelimit.BudgetTimeout` when no budget slot came within the caller's
        ``max_wait_s``. A slash command's ``response_url`` (``url``) is outside the budget. ``form``
        builds a multipart body (a new one for every try: a sent body cannot be resent).
        """
        target = url or f"{self.base_url}{path}"
        label = f"{method} {_metric_path(path)}"
        channel = str(json.get("channel_id", "")) if isinstance(json, dict) and method == "POST" else None
        policy: RetrySettings = self.settings.retry
        if retries is not None:
            policy = policy.model_copy(update={"max_retries": retries})
        if patience_s is not None:
            policy = policy.model_copy(update={"patience_s": patience_s})
        budget = RetryBudget(policy, rng=self._rng)
        while True:
            wait: float | None = None
            permit = None
            if url is None:
                permit = await self._slot(label, channel or None, max_wait_s, budget, method, path)
            try:
                client = session or self.session
                data = form() if form is not None else None
                async with client.request(method, target, json=json, params=params, data=data) as resp:
                    raw = await resp.read()
                    note_progress()  # the server answered (whatever it said): the answer moves
                    count_chat_call(PLATFORM, label, _call_outcome(resp.status))
                    if resp.status < 400:
                        if not raw or resp.content_type != "application/json":
                            return None
                        return await resp.json()
                    error = _api_error(method, path, resp, raw)
                    if resp.status == 429:
                        reason, wait = "429", retry_after_from_headers(resp.headers, "X-Ratelimit-Reset")
                    elif resp.status >= 500:
                        reason = "5xx"
                    else:
                        raise error
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
                error = mattermost_error(method, path, None, f"{type(exc).__name__}: {exc}")
                reason = "connection"
                count_chat_call(PLATFORM, label, reason)
            finally:
                if permit is not None:
                    permit.release()
            try:
                if reason == "429":
                    # The server's limiter counts every request of this user: hold them all.
                    self.budget.hold(ALL_CALLS, wait if wait is not None else 1.0)
                    delay = budget.after_rate_limit(wait, error.message)
                    self.budget.hold(ALL_CALLS, delay)
                else:
                    delay = budget.after_failure(error.message)
            except RetriesExhausted as gave_up:
                raise error.given_up(gave_up) from None
            CHAT_API_RETRIES.labels(platform=PLATFORM, method=label, reason=reason).inc()
            logger.info(
                "mattermost %s retry %d in %.2f s (%s; request_id=%s)",
                label,
                budget.attempt,
                delay,
                reason,
                error.request_id,
            )
            if reason != "429":  # a 429's wait is the budget's hold
                await asyncio.sleep(delay)

    async def _slot(
        self,
        label: str,
        channel: str | None,
        max_wait_s: float | None,
        retry: RetryBudget,
        method: str,
        path: str,
    ) -> Permit:
        """A budget slot for one try: within the caller's ``max_wait_s`` (its
        :class:`~bot.adapters.ratelimit.BudgetTimeout` is the caller's to handle), else within what
        is left of the call's deadline (past it, or when no slot can come, the call fails)."""
        if max_wait_s is not None:
            return await self.budget.acquire(label, channel, max_wait_s=max_wait_s)
        try:
            return await self.budget.acquire(label, channel, max_wait_s=retry.remaining_s())
        except BudgetStalled as exc:
            raise mattermost_error(method, path, None, str(exc), exhausted="failures") from None
        except BudgetTimeout:
            message = f"no rate-budget slot before the call's deadline ({retry.policy.deadline_s:g} s)"
            raise mattermost_error(method, path, None, message, exhausted="failures") from None

    # -- endpoints ------------------------------------------------------------------------------
    async def me(self) -> dict[str, Any]:
        """``GET /users/me``: the bot account."""
        result: dict[str, Any] = await self.request("GET", "/users/me")
        return result

    async def my_teams(self) -> list[dict[str, Any]]:
        """``GET /users/me/teams``."""
        result: list[dict[str, Any]] = await self.request("GET", "/users/me/teams")
        return result

    async def my_channels(self, team_id: str) -> list[dict[str, Any]]:
        """``GET /users/me/teams/{team_id}/channels`` (DMs and group messages included)."""
        result: list[dict[str, Any]] = await self.request("GET", f"/users/me/teams/{team_id}/channels")
        return result

    async def get_channel(self, channel_id: str) -> dict[str, Any]:
        """``GET /channels/{channel_id}``."""
        result: dict[str, Any] = await self.request("GET", f"/channels/{channel_id}")
        return result

    async def posts_since(self, channel_id: str, since_ms: int) -> list[dict[str, Any]]:
        """``GET /channels/{id}/posts?since=``: posts created or changed after ``since_ms``, oldest first."""
        body = await self.request("GET", f"/channels/{channel_id}/posts", params={"since": str(since_ms)})
        posts: dict[str, dict[str, Any]] = (body or {}).get("posts") or {}
        return sorted(posts.values(), key=lambda p: int(p.get("create_at", 0)))

    async def client_config(self) -> dict[str, Any]:
        """``GET /config/client?format=old`` (string values)."""
        result: dict[str, Any] = await self.request(
            "GET", "/config/client", params={"format": "old"}, retries=1
        )
        return result

    async def create_post(
        self,
        channel_id: str,
        message: str,
        *,
        root_id: str = "",
        props: dict[str, Any] | None = None,
        pending_post_id: str,
        file_ids: list[str] | None = None,
    ) -> dict[str, Any]:
        """``POST /posts``; ``pending_post_id`` makes retries idempotent on the server; ``file_ids``
        attaches files uploaded with :meth:`upload_file`."""
        body: dict[str, Any] = {
            "channel_id": channel_id,
            "message": message,
            "root_id": root_id,
            "pending_post_id": pending_post_id,
        }
        if props:
            body["props"] = props
        if file_ids:
            body["file_ids"] = file_ids
        result: dict[str, Any] = await self.request("POST", "/posts", json=body)
        return result

    async def get_post(self, post_id: str) -> dict[str, Any]:
        """``GET /posts/{post_id}``."""
        result: dict[str, Any] = await self.request("GET", f"/posts/{post_id}")
        return result

    async def thread_page(
        self, post_id: str, *, per_page: int, from_create_at: int = 0, from_post: str = ""
    ) -> dict[str, Any]:
        """``GET /posts/{post_id}/thread``, one page newest first (``direction=up``): the server's
        ``PostList`` (``order``, ``posts``, ``has_next``); the next page starts before
        ``from_create_at`` / ``from_post``, the oldest post of this one."""
        params = {"perPage": str(per_page), "direction": "up"}
        if from_create_at:
            params["fromCreateAt"] = str(from_create_at)
            if from_post:
                params["fromPost"] = from_post
        result: dict[str, Any] = await self.request("GET", f"/posts/{post_id}/thread", params=params)
        return result

    async def upload_file(self, channel_id: str, filename: str, content: bytes) -> dict[str, Any]:
        """``POST /files`` (multipart: ``channel_id``, one ``files`` part): the file's ``FileInfo``."""

        def form() -> aiohttp.FormData:
            data = aiohttp.FormData()
            data.add_field("channel_id", channel_id)
            data.add_field("files", content, filename=filename, content_type="text/markdown")
            return data

        body = await self.request("POST", "/files", form=form)
        infos = (body or {}).get("file_infos") or []
        if not infos:
            raise mattermost_error("POST", "/files", 201, "no file_infos in the answer")
        info: dict[str, Any] = infos[0]
        return info

    async def patch_post(
        self, post_id: str, message: str, props: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """``PUT /posts/{id}/patch`` (message, and props when given)."""
        body: dict[str, Any] = {"message": message}
        if props is not None:
            body["props"] = props
        result: dict[str, Any] = await self.request("PUT", f"/posts/{post_id}/patch", json=body)
        return result

    async def get_user(self, user_id: str) -> dict[str, Any]:
        """``GET /users/{user_id}`` (``is_bot`` tells bot accounts)."""
        result: dict[str, Any] = await self.request("GET", f"/users/{user_id}")
        return result

    async def add_reaction(self, user_id: str, post_id: str, emoji: str, **call: Any) -> None:
        """``POST /reactions``: ``user_id`` (the bot itself) reacts to ``post_id`` with ``emoji``."""
        body = {"user_id": user_id, "post_id": post_id, "emoji_name": emoji}
        await self.request("POST", "/reactions", json=body, **call)

    async def remove_reaction(self, user_id: str, post_id: str, emoji: str, **call: Any) -> None:
        """``DELETE /users/{user_id}/posts/{post_id}/reactions/{emoji}``."""
        await self.request("DELETE", f"/users/{user_id}/posts/{post_id}/reactions/{emoji}", **call)

    async def create_ephemeral(self, user_id: str, channel_id: str, message: str, root_id: str = "") -> None:
        """``POST /posts/ephemeral``: a post only ``user_id`` sees."""
        post = {"channel_id": channel_id, "message": message, "root_id": root_id}
        await self.request("POST", "/posts/ephemeral", json={"user_id": user_id, "post": post})

    async def command_response(self, response_url: str, body: dict[str, Any]) -> None:
        """POST a slash command's delayed response to its ``response_url``."""
        if self._plain is None:
            raise RuntimeError("MattermostRest.start() was not called")
        await self.request("POST", "/hooks/commands", json=body, url=response_url, session=self._plain)


def _api_error(method: str, path: str, resp: aiohttp.ClientResponse, raw: bytes) -> MattermostAPIError:
    request_id = resp.headers.get("X-Request-Id")
    error_id: str | None = None
    message = raw.decode("utf-8", "replace").strip()[:300]
    if resp.content_type == "application/json":
        try:
            body = jsonlib.loads(raw)
            if isinstance(body, dict):
                error_id = body.get("id")
                message = str(body.get("message", message))
                request_id = body.get("request_id") or request_id
        except ValueError:
            pass
    return mattermost_error(method, path, resp.status, message, error_id=error_id, request_id=request_id)


def monotonic_ms() -> int:
    """Wall-clock milliseconds (Mattermost timestamps are Unix ms)."""
    return int(time.time() * 1000)
