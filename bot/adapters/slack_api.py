"""Slack's Web API under opsbot's transport: every call of the adapter, of bolt and of slack_sdk's
chat-stream helper goes through :class:`SlackWebClient` (the twin of ``mattermost_rest.py``).

Each try takes a slot of the app-wide rate budget (:mod:`bot.adapters.ratelimit`: Slack's tiers
per method, about one post per second per channel; a slot the caller already waited for pays for
the first try), waits out a 429's ``Retry-After`` for that method across the whole app, backs off
on 5xx and connection errors under the one retry policy (:mod:`bot.retry`, each retry counted in
``CHAT_API_RETRIES``; ``retry.deadline_s`` bounds the whole call), and before re-posting a
``chat.postMessage`` that may already have been stored it looks for the post's metadata tag in the
thread. A call that fails for good raises a :class:`SlackCallError` of the matching branch of
:mod:`bot.errors` (mapped here, in one place).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from bot.adapters.ratelimit import (
    BudgetStalled,
    BudgetTimeout,
    RateBudget,
)
from bot.config import RetrySettings
from bot.errors import (
    PlatformError,
    PlatformRejected,
    PlatformThrottled,
    PlatformUnavailable,
    platform_branch,
)
from bot.metrics import CHAT_API_RETRIES, count_chat_call
from bot.progress import note_progress
from bot.retry import (
    RetriesExhausted,
    RetryBudget,
    RetryKnobs,
    retry_after_from_headers,
)

logger = logging.getLogger(__name__)

PLATFORM = "slack"
POST_EVENT_TYPE = "opsbot_post"
"""``metadata.event_type`` of every message opsbot posts; its ``event_payload`` carries the request
id and a key unique to the post, by which a retried post is found instead of posted twice."""
_NOT_REPLAYABLE = frozenset({"chat.startStream", "chat.appendStream", "chat.stopStream"})
# A stream call that failed with a 5xx or a timeout may have taken effect, and it cannot be found
# again by a tag: it is not retried blindly; the reply repairs the message (chat.update) instead.


class SlackCallError(PlatformError, SlackApiError):
    """A Web API call failed for good; its subclasses place it in :mod:`bot.errors`' tree.

    It is a ``SlackApiError`` too, so bolt and slack_sdk helpers that call through the transport
    handle it as they handle Slack's own errors.
    """

    def __init__(
        self,
        method: str,
        error: str,
        *,
        http_status: int | None = None,
        response: AsyncSlackResponse | None = None,
    ) -> None:
        SlackApiError.__init__(self, f"{method}: {error}", response)  # type: ignore[no-untyped-call]
        self.method = method
        self.error = error
        """Slack's error code (``not_in_channel``, ``ratelimited``, ...) or what went wrong."""
        self.http_status = http_status

    def __str__(self) -> str:
        return f"{self.method}: {self.error}"


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
    method: str,
    error: str,
    *,
    http_status: int | None,
    exhausted: str | None = None,
    response: AsyncSlackResponse | None = None,
) -> SlackCallError:
    """The :class:`SlackCallError` of the right branch for a failed call."""
    cls = _SLACK_BRANCH[platform_branch(http_status=http_status, exhausted=exhausted)]
    return cls(method, error, http_status=http_status, response=response)


_POLICY: contextvars.ContextVar[RetryKnobs | None] = contextvars.ContextVar(
    "opsbot_slack_policy", default=None
)


@contextlib.contextmanager
def call_policy(policy: RetryKnobs) -> Iterator[None]:
    """Calls made in this block retry under ``policy`` instead of ``slack.retry`` (signs of life:
    no long waits)."""
    token = _POLICY.set(policy)
    try:
        yield
    finally:
        _POLICY.reset(token)


class SlackWebClient(AsyncWebClient):
    """slack_sdk's client with opsbot's transport under every call (see the module docstring)."""

    def __init__(self, *, rate_budget: RateBudget, retry: RetrySettings, **kwargs: Any) -> None:
        # Retries are ours: the budget must see every attempt, so slack_sdk's own handlers are off.
        super().__init__(retry_handlers=[], **kwargs)
        self.rate_budget = rate_budget
        self.retry_policy = retry
        self.bot_id: str | None = None
        """The bot's own ``bot_id`` (set after ``auth.test``), to recognise its own posts."""

    async def api_call(  # type: ignore[override]
        self,
        api_method: str,
        *,
        http_verb: str = "POST",
        files: dict[str, Any] | None = None,
        data: Any = None,
        params: dict[str, Any] | None = None,
        json: dict[str, Any] | None = None,
        headers: dict[str, Any] | None = None,
        auth: dict[str, Any] | None = None,
    ) -> AsyncSlackResponse:
        """One Web API call: a rate-budget slot, the call, retries under the retry policy."""
        args: Mapping[str, Any] = json if json is not None else params if params is not None else {}
        if not args and isinstance(data, Mapping):
            args = data
        channel = str(args.get("channel") or args.get("channel_id") or "") or None
        budget = RetryBudget(_POLICY.get() or self.retry_policy)
        first_try_wall = time.time()
        while True:
            async with self._try_slot(api_method, channel, budget):
                try:
                    response = await super().api_call(
                        api_method,
                        http_verb=http_verb,
                        files=files,
                        data=data,
                        params=params,
                        json=json,
                        headers=headers,
                        auth=auth,
                    )
                    note_progress()  # Slack answered: the answer moves
                    count_chat_call(PLATFORM, api_method, "ok")
                    return response
                except SlackApiError as exc:
                    note_progress()  # an error answer is an answer too (no hang)
                    reason, detail, status, delay = self._after_error_answer(api_method, exc, budget)
                except (aiohttp.ClientError, TimeoutError) as exc:
                    reason, detail, status = "connection", type(exc).__name__, None
                    count_chat_call(PLATFORM, api_method, reason)
                    try:
                        delay = budget.after_failure(detail)
                    except RetriesExhausted as gave_up:
                        raise slack_error(
                            api_method, str(gave_up), http_status=None, exhausted=gave_up.reason
                        ) from exc
            # Outside the slot: the failed attempt's token refills from now.
            if reason != "ratelimited":
                posted = await self._before_replay(api_method, json, detail, status, first_try_wall)
                if posted is not None:
                    return posted
            CHAT_API_RETRIES.labels(PLATFORM, api_method, reason).inc()
            logger.info(
                "slack %s retry %d in %.2f s: %s (channel=%s)",
                api_method,
                budget.attempt,
                delay,
                detail,
                channel,
            )
            if reason != "ratelimited":  # a 429's wait is the budget's hold on the method
                await asyncio.sleep(delay)

    def _after_error_answer(
        self, api_method: str, exc: SlackApiError, budget: RetryBudget
    ) -> tuple[str, str, int, float]:
        """What an error answer means: ``(reason, detail, HTTP status, seconds before the next try)``
        for a 429 or a 5xx; raises the mapped :mod:`bot.errors` error for a request Slack refused
        (another 4xx) or when the retries ran out."""
        status = exc.response.status_code
        body = exc.response.data
        error = str(body.get("error", "")) if isinstance(body, dict) else ""
        detail = error or f"HTTP {status}"
        if status != 429 and status < 500:
            count_chat_call(PLATFORM, api_method, "rejected")
            raise slack_error(api_method, detail, http_status=status, response=exc.response) from exc
        count_chat_call(PLATFORM, api_method, "ratelimited" if status == 429 else "server_error")
        try:
            if status != 429:
                return "server_error", detail, status, budget.after_failure(detail)
            wait = retry_after_from_headers(exc.response.headers)
            # Slack counts per method per app: hold the method everywhere, not just for this
            # channel or this answer.
            self.rate_budget.hold(api_method, wait if wait is not None else 1.0)
            delay = budget.after_rate_limit(wait, detail)
            self.rate_budget.hold(api_method, delay)
            return "ratelimited", detail, status, delay
        except RetriesExhausted as gave_up:
            raise slack_error(
                api_method, str(gave_up), http_status=status, exhausted=gave_up.reason, response=exc.response
            ) from exc

    async def _before_replay(
        self,
        api_method: str,
        json: dict[str, Any] | None,
        detail: str,
        status: int | None,
        first_try_wall: float,
    ) -> AsyncSlackResponse | None:
        """Before a failed call is tried again: refuse to replay a call that may have taken effect,
        and return the message a failed ``chat.postMessage`` stored after all (``None``: try again)."""
        if api_method in _NOT_REPLAYABLE:
            raise slack_error(
                api_method,
                f"{detail} (not retried: it may have taken effect)",
                http_status=status,
                exhausted="failures",
            )
        if api_method != "chat.postMessage" or not isinstance(json, dict):
            return None
        found = await self._already_posted(json, first_try_wall)
        if found is None:
            return None
        logger.info(
            "slack chat.postMessage: the failed try was stored after all (ts=%s); not posting it again",
            found["ts"],
        )
        return AsyncSlackResponse(
            client=self,
            http_verb="POST",
            api_url=f"{self.base_url}{api_method}",
            req_args={"json": json},
            data=found,
            headers={},
            status_code=200,
        )

    @contextlib.asynccontextmanager
    async def _try_slot(
        self, api_method: str, channel: str | None, retry: RetryBudget
    ) -> AsyncIterator[None]:
        """A budget slot for one try (a permit the caller passed pays for the first) within what is
        left of the call's deadline; past it, or when no slot can come, the call fails."""
        try:
            permit = await self.rate_budget.acquire(api_method, channel, max_wait_s=retry.remaining_s())
        except BudgetStalled as exc:
            raise slack_error(api_method, str(exc), http_status=None, exhausted="failures") from None
        except BudgetTimeout:
            detail = f"no rate-budget slot before the call's deadline ({retry.policy.deadline_s:g} s)"
            raise slack_error(api_method, detail, http_status=None, exhausted="failures") from None
        try:
            yield
        finally:
            permit.release()

    async def _already_posted(self, args: Mapping[str, Any], since_wall: float) -> dict[str, Any] | None:
        """The message a failed ``chat.postMessage`` stored after all, found by its metadata tag."""
        meta = args.get("metadata")
        if not isinstance(meta, Mapping) or meta.get("event_type") != POST_EVENT_TYPE:
            return None
        key = (meta.get("event_payload") or {}).get("post_key")
        channel = str(args.get("channel", ""))
        thread = args.get("thread_ts")
        # Slack's ts is the server's clock: look back a little further than our first try.
        query: dict[str, Any] = {
            "channel": channel,
            "include_all_metadata": "true",
            "oldest": f"{since_wall - 60:.6f}",
            "limit": 200,
        }
        method = "conversations.history"
        if thread:
            method, query["ts"] = "conversations.replies", str(thread)
        try:
            resp = await self.api_call(method, http_verb="GET", params=query)
        except SlackCallError as exc:  # cannot tell: posting again risks a duplicate, not posting a loss
            logger.warning("slack: cannot look for a possibly stored post (%s); posting again", exc)
            return None
        for msg in resp.get("messages") or []:
            payload = (msg.get("metadata") or {}).get("event_payload") or {}
            if (msg.get("metadata") or {}).get("event_type") == POST_EVENT_TYPE and payload.get(
                "post_key"
            ) == key:
                return {"ok": True, "channel": channel, "ts": msg.get("ts"), "message": msg}
        return None
