"""The one retry policy: every Slack Web API call, Mattermost REST call, websocket reconnect loop and
the store's write buffer decide "wait how long, or give up?" here.

The rules:

- **A 429 is a wait, not a failure.** The platform's ``Retry-After`` (seconds or an HTTP date,
  parsed once in :func:`parse_retry_after`) is honoured, never shortened; throttles are bounded
  by time (``patience_s``), not by count, so a busy channel delays an answer instead of losing it.
- **5xx, timeouts and connection errors count against ``max_retries``**, each waiting a jittered
  exponential backoff (:func:`backoff_delay`): the jitter spreads the retries of several replicas
  that lost the same server together. ``max_retries = None`` retries for ever (reconnect loops,
  the store's buffer), still with backoff.
- Everything else (a 4xx that says the request itself is wrong) is not retried: the caller
  raises at once.

- **A deadline bounds the whole call** where one is set (``deadline_s``): rate-budget waits, tries,
  backoffs and ``Retry-After`` waits together (:meth:`RetryBudget.remaining_s`); a retry that would
  start past it gives up instead. Calls made inside :func:`until_deadline` (an answer's final
  delivery: the answer is lost if it gives up) retry failures until that deadline rather than
  ``max_retries`` times.

The knobs have one shape everywhere (:class:`bot.config.RetrySettings`: ``max_retries``,
``initial_s``, ``max_s``, ``patience_s``, ``deadline_s``) in ``[slack.retry]``, ``[mattermost.retry]``,
``[mattermost.reconnect]``, ``[slack.reconnect]`` and ``[store.retry]``.
"""

from __future__ import annotations

import contextlib
import contextvars
import random
import time
from collections.abc import Callable, Iterator, Mapping
from email.utils import parsedate_to_datetime
from typing import Any, Protocol

from bot.errors import OpsbotError

RATE_LIMIT_MARGIN_S = (0.05, 0.25)
_JITTER = random.Random()
"""The jitter of every budget without its own generator: one per process, since seeding a new
``random.Random`` from the OS for each Web API call was 2% of the event loop's time under a burst."""
"""Seconds added to a server's ``Retry-After`` (uniform in this range), so no retry lands early."""


class RetryKnobs(Protocol):
    """The retry knobs (the shape of :class:`bot.config.RetrySettings`)."""

    @property
    def max_retries(self) -> int | None: ...
    @property
    def initial_s(self) -> float: ...
    @property
    def max_s(self) -> float: ...
    @property
    def patience_s(self) -> float: ...
    @property
    def deadline_s(self) -> float | None: ...


_UNTIL_DEADLINE: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "opsbot_retry_until_deadline", default=False
)


@contextlib.contextmanager
def until_deadline() -> Iterator[None]:
    """Calls started in this block (by this task) retry 5xx, timeouts and connection errors until
    their policy's ``deadline_s`` instead of ``max_retries`` times (a policy without a deadline
    keeps its ``max_retries``)."""
    token = _UNTIL_DEADLINE.set(True)
    try:
        yield
    finally:
        _UNTIL_DEADLINE.reset(token)


class RetriesExhausted(OpsbotError):
    """The policy says give up: ``max_retries`` failures, rate limited past ``patience_s``, or the
    next try would start past ``deadline_s`` (reported with the reason of the failure at hand).

    ``reason`` is ``"failures"`` or ``"rate_limited"``; the message says how many / how long.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def backoff_delay(attempt: int, initial_s: float, max_s: float, rng: random.Random | None = None) -> float:
    """Seconds to wait before retry ``attempt`` (0-based): ``initial_s * 2**attempt`` capped at
    ``max_s``, with "equal jitter" (a uniform draw from the upper half), so the delay still grows
    while replicas that failed together spread out."""
    cap = min(max_s, initial_s * 2.0 ** min(attempt, 62))
    return (rng or random).uniform(cap / 2, cap)


def parse_retry_after(value: object, *, now: float | None = None) -> float | None:
    """Seconds from a ``Retry-After`` value: delta-seconds (``"30"``, ``"1.5"``) or an HTTP date
    (``"Wed, 21 Oct 2026 07:28:00 GMT"``); ``None`` when absent or unreadable. Never negative."""
    if isinstance(value, list | tuple):
        value = value[0] if value else None
    if value is None:
        return None
    text = str(value).strip()
    if not text:
        return None
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def retry_after_from_headers(headers: Mapping[str, Any], *fallbacks: str) -> float | None:
    """``Retry-After`` from response headers (any case), else the first readable ``fallbacks`` header
    (Mattermost's ``X-Ratelimit-Reset``: seconds until its bucket refills)."""
    lowered = {str(k).lower(): v for k, v in headers.items()}
    for name in ("retry-after", *(f.lower() for f in fallbacks)):
        seconds = parse_retry_after(lowered.get(name))
        if seconds is not None:
            return seconds
    return None


class RetryBudget:
    """One operation's retries under a :class:`RetryKnobs` policy.

    Create one per call (a Web API request) or per loop (a reconnect supervisor, which calls
    :meth:`reset` after each success). Each ``after_*`` method returns the seconds to wait before
    the next try, or raises :class:`RetriesExhausted`.
    """

    def __init__(
        self,
        policy: RetryKnobs,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self._rng = rng or _JITTER
        self._clock = clock
        self.failures = 0
        """Failures (5xx, timeouts, connection errors) since the start or the last :meth:`reset`."""
        self.rate_limits = 0
        """429s since the start or the last :meth:`reset`."""
        self._limited_since: float | None = None
        self._started = clock()
        self._max_failures = (
            None if _UNTIL_DEADLINE.get() and policy.deadline_s is not None else policy.max_retries
        )

    def remaining_s(self) -> float | None:
        """Seconds left before the policy's ``deadline_s`` (never negative; ``None``: no deadline)."""
        deadline = self.policy.deadline_s
        if deadline is None:
            return None
        return max(0.0, deadline - (self._clock() - self._started))

    def _within_deadline(self, delay: float, reason: str, detail: str) -> None:
        left = self.remaining_s()
        if left is not None and delay >= left:
            raise RetriesExhausted(
                reason,
                f"{detail or 'failed'}: gave up after {self._clock() - self._started:.0f} s "
                f"(deadline {self.policy.deadline_s:g} s)",
            )

    def reset(self) -> None:
        """A try succeeded: the next failure starts from the first backoff again (and a loop's
        deadline from now)."""
        self.failures = 0
        self.rate_limits = 0
        self._limited_since = None
        self._started = self._clock()

    def after_failure(self, detail: str = "") -> float:
        """A 5xx, timeout or connection error: the backoff before the next try."""
        limit = self._max_failures
        if limit is not None and self.failures >= limit:
            raise RetriesExhausted("failures", f"{detail or 'failed'} after {self.failures} retries".strip())
        delay = backoff_delay(self.failures, self.policy.initial_s, self.policy.max_s, self._rng)
        self._within_deadline(delay, "failures", detail)
        self.failures += 1
        return delay

    def after_rate_limit(self, retry_after: float | None, detail: str = "") -> float:
        """A 429: wait what the server asked (plus a little jitter, never less), or back off when it
        named no wait; raise once rate limits have lasted longer than ``patience_s``."""
        now = self._clock()
        if self._limited_since is None:
            self._limited_since = now
        if retry_after is None:
            delay = backoff_delay(self.rate_limits, self.policy.initial_s, self.policy.max_s, self._rng)
        else:
            # A margin on top (never less than asked): the server's window and our clock differ a little.
            delay = retry_after + self._rng.uniform(*RATE_LIMIT_MARGIN_S)
        waited = now - self._limited_since
        if waited + delay > self.policy.patience_s:
            raise RetriesExhausted(
                "rate_limited", f"{detail or 'rate limited'}: still rate limited after {waited:.0f} s"
            )
        self._within_deadline(delay, "rate_limited", detail)
        self.rate_limits += 1
        return delay

    @property
    def attempt(self) -> int:
        """Retries so far, of either kind (for log lines)."""
        return self.failures + self.rate_limits
