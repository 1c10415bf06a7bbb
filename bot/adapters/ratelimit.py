"""App-wide rate budgets: token buckets per method and per channel, shared by every answer of an app.

Chat platforms count calls per method per app (Slack's tiers: ``chat.update`` is Tier 3, 50 per
minute for the whole app, however many answers stream at once) and posts per channel (about one
per second, with short bursts). One :class:`RateBudget` per adapter holds every bucket; every Web
API / REST call asks it for a slot first (:meth:`RateBudget.slot`), so N streams share one
``chat.update`` budget instead of each pacing itself.

**Buckets.** A :class:`~bot.config.RateLimit` of ``per_minute`` calls with a ``burst``: ``burst``
calls may start at once, the rest refill evenly (one every ``60 / (per_minute - burst)`` s), so no
60 s window ever holds more than ``per_minute``. A call's token refills from the moment the call
*completed*, not when it started: the server counts arrivals, which lie between the two, so the
server never sees calls closer together than the budget allowed (a call in flight counts as spent).

**Fair sharing.** Waiters are served by :class:`Priority` (a final answer first, then signs of
life, then streaming edits, then housekeeping), and within one priority by ``since``: the stream
that waited longest since its last edit goes first. A waiter blocked on its own channel does not
hold up others that are free to go (work-conserving).

**Retry-After.** :meth:`RateBudget.hold` stops a method (or, with ``"*"``, everything) for the
whole app until the server's ``Retry-After`` has passed: after one 429 no call of that method
starts early, whichever stream or channel it is for. Holds apply even when budgets are turned off.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import enum
import itertools
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from bot.config import RateLimit

logger = logging.getLogger(__name__)

ALL_CALLS = "*"
"""The bucket (and hold) every call passes through, where a platform limits calls as a whole
(Mattermost: requests per second per user)."""


RESERVATION_TTL_S = 600.0
"""A promised call (:meth:`RateBudget.reserve`) not made within this long is forgotten (its answer
was abandoned; the request deadline is shorter)."""


class Priority(enum.IntEnum):
    """Who goes first when calls wait for the same budget (lower first)."""

    FINAL = 0
    """The last edit or post of an answer: it carries the whole text, footer and buttons."""
    ACK = 1
    """A sign of life (reaction, thread status): worthless when late."""
    STREAM = 2
    """An intermediate edit or append of a streaming answer (the newest text wins anyway)."""
    BACKGROUND = 3
    """Housekeeping: swapping reactions, look-ups."""


@dataclass(frozen=True, slots=True)
class Ticket:
    """How a call queues: its priority and since when its stream has waited (``None``: from now)."""

    priority: Priority = Priority.FINAL
    since: float | None = None


_TICKET: contextvars.ContextVar[Ticket | None] = contextvars.ContextVar("opsbot_rate_ticket", default=None)


@contextlib.contextmanager
def ticket(priority: Priority, since: float | None = None) -> Iterator[None]:
    """Calls made inside this block (by this task) queue with ``priority`` / ``since``: how a helper
    that makes the calls itself (slack_sdk's chat stream) is given a place in the queue."""
    token = _TICKET.set(Ticket(priority, since))
    try:
        yield
    finally:
        _TICKET.reset(token)


def current_ticket() -> Ticket:
    """The ticket of the calling task (:func:`ticket`), by default a final-priority one."""
    return _TICKET.get() or Ticket()


_PREPAID: contextvars.ContextVar[Permit | None] = contextvars.ContextVar("opsbot_rate_prepaid", default=None)


@contextlib.contextmanager
def prepaid(permit: Permit | None) -> Iterator[None]:
    """The next call of ``permit``'s method made in this block (or in a task created in it) uses
    ``permit`` instead of queueing again: a caller that waited for its slot first, to send the
    newest text once it has one."""
    token = _PREPAID.set(permit)
    try:
        yield
    finally:
        _PREPAID.reset(token)


def take_prepaid(method: str) -> Permit | None:
    """The permit :func:`prepaid` left for a call of ``method``, once (a retry queues again)."""
    permit = _PREPAID.get()
    if permit is None or permit.method != method or permit.released:
        return None
    _PREPAID.set(None)
    return permit


def release_when_done(permit: Permit) -> Callable[[asyncio.Future[Any]], None]:
    """A done-callback that releases ``permit`` when the call (a future) completes."""

    def _release(_: asyncio.Future[Any]) -> None:
        permit.release()

    return _release


class BudgetTimeout(Exception):
    """No slot within the caller's ``max_wait_s`` (the call was not made)."""


class _Bucket:
    """GCRA token bucket with completion-time accounting (see the module docstring)."""

    __slots__ = ("burst", "in_flight", "refill_s", "tat")

    def __init__(self, refill_s: float, burst: int) -> None:
        self.refill_s = refill_s
        self.burst = burst
        self.tat = -math.inf  # theoretical arrival time of the next conforming call
        self.in_flight = 0

    def ready_at(self) -> float | None:
        """Earliest time one more call conforms, or ``None`` until a call in flight completes."""
        tolerance = (self.burst - 1) * self.refill_s
        pending = self.in_flight * self.refill_s
        if pending > tolerance:
            return None
        return self.tat - tolerance + pending

    def available(self, now: float) -> int:
        """How many calls could start at ``now`` (one after the other, without waiting)."""
        tolerance = (self.burst - 1) * self.refill_s
        ahead = max(self.tat - now, 0.0)
        if ahead > tolerance:
            return 0
        return max(0, int((tolerance - ahead) / self.refill_s + 1e-9) + 1 - self.in_flight)

    def take(self) -> None:
        self.in_flight += 1

    def give_back(self, completed_at: float) -> None:
        self.in_flight -= 1
        self.tat = max(self.tat, completed_at) + self.refill_s


@dataclass(order=True)
class _Waiter:
    priority: int
    since: float
    seq: int
    buckets: tuple[_Bucket, ...] = field(compare=False)
    holds: tuple[str, ...] = field(compare=False)
    deadline: float | None = field(compare=False)
    future: asyncio.Future[None] = field(compare=False)


class Permit:
    """A granted slot; :meth:`release` when the call completed (``slot`` does it for you)."""

    def __init__(
        self, budget: RateBudget, method: str, buckets: tuple[_Bucket, ...], waited_s: float
    ) -> None:
        self._budget = budget
        self.method = method
        self._buckets = buckets
        self.waited_s = waited_s
        """Seconds the call waited for its slot."""
        self._released = False

    @property
    def released(self) -> bool:
        """Whether :meth:`release` was called."""
        return self._released

    def release(self) -> None:
        """The call completed (or was abandoned): its tokens start refilling now."""
        if self._released:
            return
        self._released = True
        self._budget._release(self._buckets)


class RateBudget:
    """Every rate budget of one app (one adapter): method buckets, channel buckets, holds.

    ``limits``: app-wide budget per method name (``"*"``: every call). ``channel_limits``: per-channel
    budget per method as ``(refill seconds, burst)`` (``chat.postMessage``: one per second, a burst
    of 3). ``enabled=False`` keeps only the ``Retry-After`` holds (benchmarks without budgets).
    """

    def __init__(
        self,
        limits: Mapping[str, RateLimit] | None = None,
        *,
        channel_limits: Mapping[str, tuple[float, int]] | None = None,
        enabled: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.enabled = enabled
        self.clock = clock
        self._method_limits = dict(limits or {}) if enabled else {}
        self._channel_limits = {k: v for k, v in (channel_limits or {}).items() if enabled and v[0] > 0}
        self._buckets: dict[str, _Bucket] = {}
        self._holds: dict[str, float] = {}
        self._reserved: dict[str, list[float]] = {}
        self._waiters: list[_Waiter] = []
        self._seq = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self.granted: dict[str, int] = {}
        """Slots granted per method (for tests and logs)."""

    # -- asking ---------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def slot(
        self,
        method: str,
        channel: str | None = None,
        *,
        ticket: Ticket | None = None,
        max_wait_s: float | None = None,
    ) -> AsyncIterator[Permit]:
        """Wait for a slot for one call of ``method`` (to ``channel``), make the call inside the block
        (a permit the caller left with :func:`prepaid` is used instead of waiting again).

        Raises :class:`BudgetTimeout` when no slot came within ``max_wait_s``.
        """
        permit = take_prepaid(method) or await self.acquire(
            method, channel, ticket=ticket, max_wait_s=max_wait_s
        )
        try:
            yield permit
        finally:
            permit.release()

    async def acquire(
        self,
        method: str,
        channel: str | None = None,
        *,
        ticket: Ticket | None = None,
        max_wait_s: float | None = None,
    ) -> Permit:
        """:meth:`slot` without the block: the caller must :meth:`Permit.release` the permit."""
        t = ticket or current_ticket()
        now = self.clock()
        buckets = self._buckets_for(method, channel)
        holds = (method, ALL_CALLS)
        waiter = _Waiter(
            priority=int(t.priority),
            since=now if t.since is None else t.since,
            seq=next(self._seq),
            buckets=buckets,
            holds=holds,
            deadline=None if max_wait_s is None else now + max_wait_s,
            future=asyncio.get_running_loop().create_future(),
        )
        self._waiters.append(waiter)
        self._dispatch()
        try:
            await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled() and waiter.future.exception() is None:
                Permit(self, method, buckets, 0.0).release()  # granted as we were cancelled: hand it back
            else:
                self._forget(waiter)
            raise
        except BudgetTimeout:
            raise BudgetTimeout(f"no {method} slot within {max_wait_s:.1f} s") from None
        self.granted[method] = self.granted.get(method, 0) + 1
        return Permit(self, method, buckets, self.clock() - now)

    def hold(self, method: str, seconds: float) -> None:
        """Nothing of ``method`` (``"*"``: nothing at all) starts within ``seconds`` (a Retry-After)."""
        until = self.clock() + max(0.0, seconds)
        if until > self._holds.get(method, -math.inf):
            self._holds[method] = until
            logger.info("rate budget: %s held for %.2f s (Retry-After)", method, seconds)
        self._dispatch()

    def held_until(self, method: str) -> float:
        """When the hold on ``method`` ends (``-inf``: not held)."""
        return max(self._holds.get(method, -math.inf), self._holds.get(ALL_CALLS, -math.inf))

    def waiting(self, method: str | None = None) -> int:
        """Calls waiting for a slot (of ``method``, or all)."""
        if method is None:
            return len(self._waiters)
        return sum(1 for w in self._waiters if w.holds[0] == method)

    def spare(self, method: str) -> int:
        """Calls of ``method`` that could start right now beyond those already waiting and those
        promised (:meth:`reserve`); a method without a budget has plenty."""
        now = self.clock()
        if any(self._holds.get(h, -math.inf) > now for h in (method, ALL_CALLS)):
            return 0
        buckets = self._buckets_for(method, None)
        if not buckets:
            return 1_000_000
        waiting = sum(1 for w in self._waiters if set(w.buckets) & set(buckets))
        free = min(b.available(now) for b in buckets)
        promised = self._reserved.setdefault(method, [])
        promised[:] = [t for t in promised if t > now - RESERVATION_TTL_S]  # abandoned answers
        return max(0, free - waiting - len(promised))

    def reserve(self, method: str) -> None:
        """Promise one future call of ``method`` (an answer's final edit) so :meth:`spare` counts it."""
        self._reserved.setdefault(method, []).append(self.clock())

    def unreserve(self, method: str) -> None:
        """The promised call is being made (or is no longer needed)."""
        promised = self._reserved.get(method)
        if promised:
            promised.pop(0)

    # -- the queue ------------------------------------------------------------------------------
    def _buckets_for(self, method: str, channel: str | None) -> tuple[_Bucket, ...]:
        out: list[_Bucket] = []
        for name in (ALL_CALLS, method):
            limit = self._method_limits.get(name)
            if limit is not None:
                out.append(self._bucket(name, 60.0 / (limit.per_minute - limit.burst), limit.burst))
        spec = self._channel_limits.get(method) if channel else None
        if spec is not None:
            out.append(self._bucket(f"{method}#{channel}", spec[0], spec[1]))
        return tuple(out)

    def _bucket(self, name: str, refill_s: float, burst: int) -> _Bucket:
        bucket = self._buckets.get(name)
        if bucket is None:
            bucket = self._buckets[name] = _Bucket(refill_s, burst)
        return bucket

    def _ready_at(self, waiter: _Waiter) -> float | None:
        ready = max(self._holds.get(h, -math.inf) for h in waiter.holds)
        for bucket in waiter.buckets:
            at = bucket.ready_at()
            if at is None:
                return None
            ready = max(ready, at)
        return ready

    def _release(self, buckets: tuple[_Bucket, ...]) -> None:
        now = self.clock()
        for bucket in buckets:
            bucket.give_back(now)
        self._dispatch()

    def _forget(self, waiter: _Waiter) -> None:
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)
        self._dispatch()

    def _dispatch(self) -> None:
        """Grant every slot that is free now, best waiter first; arm a timer for the next one."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        now = self.clock()
        self._waiters = [w for w in self._waiters if not w.future.done()]
        granted = True
        while granted:
            granted = False
            for waiter in sorted(self._waiters):
                ready = self._ready_at(waiter)
                if ready is not None and ready <= now:
                    for bucket in waiter.buckets:
                        bucket.take()
                    self._waiters.remove(waiter)
                    waiter.future.set_result(None)
                    granted = True
                    break  # buckets changed: look again from the best waiter
        wake: float | None = None
        for waiter in list(self._waiters):
            if waiter.deadline is not None and waiter.deadline <= now:
                self._waiters.remove(waiter)
                waiter.future.set_exception(BudgetTimeout())
                continue
            for at in (self._ready_at(waiter), waiter.deadline):
                if at is not None and (wake is None or at < wake):
                    wake = at
        if wake is not None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(max(0.0, wake - now), self._dispatch)
