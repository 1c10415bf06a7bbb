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

**No task waits for a token while holding one of the same bucket.** A caller that waited for its
slot first (a streaming reply takes its slot, then the newest text) passes the permit down with
:func:`prepaid`; the transport's first try spends it (:meth:`RateBudget.acquire` takes a passed
permit of its method before anything else) and releases it when that try completes; retries and
their backoff queue again and hold nothing while they sleep. So every platform call is charged
exactly once, and no call can wait for a bucket its own caller keeps full: three answers each
holding a token of a channel's burst of 3 while their transports asked for a fourth waited for
ever (issue 42). Two guards report what breaks the rule anyway, as bugs (an ERROR log line and
``opsbot_rate_budget_problems_total``): a wait that starts while a passed permit of another method
on the same bucket is still unspent (``kind="wait_while_holding"``), and a wait that cannot end
because its bucket is full of calls and none completed for ``stall_after_s``
(``kind="stalled"``): those waits fail with :class:`BudgetStalled` instead of hanging, which ends
their calls and frees whatever their callers hold.
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
from bot.errors import OpsbotError
from bot.metrics import RATE_BUDGET_PROBLEMS

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


def _take_prepaid(method: str) -> Permit | None:
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


class BudgetTimeout(OpsbotError):
    """No slot within the caller's ``max_wait_s`` (the call was not made)."""


class BudgetStalled(BudgetTimeout):
    """No slot can come: the bucket is full of calls in flight and none completed for the budget's
    ``stall_after_s`` (a bug the budget reports; the call was not made)."""


STALL_AFTER_S = 120.0
"""Default :class:`RateBudget` ``stall_after_s``: well above the longest single try of a platform
call (each try has its own HTTP timeout, 30 s by default on both platforms)."""


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
    method: str = field(compare=False)
    buckets: tuple[_Bucket, ...] = field(compare=False)
    holds: tuple[str, ...] = field(compare=False)
    deadline: float | None = field(compare=False)
    queued_at: float = field(compare=False)
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
    ``name`` labels the budget's log lines and metrics (the platform); ``stall_after_s``: a wait
    whose bucket is full of calls none of which completed for this long fails (see the module
    docstring).
    """

    def __init__(
        self,
        limits: Mapping[str, RateLimit] | None = None,
        *,
        channel_limits: Mapping[str, tuple[float, int]] | None = None,
        enabled: bool = True,
        name: str = "chat",
        stall_after_s: float = STALL_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.enabled = enabled
        self.name = name
        self.stall_after_s = stall_after_s
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
        self.stalled = 0
        """Waits failed with :class:`BudgetStalled` (for tests and logs)."""
        self._moved_at = clock()
        """When a slot was last granted or released: a bucket full of calls waits for a release."""
        self._reported: set[tuple[str, str]] = set()

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

        Raises :class:`BudgetTimeout` when no slot came within ``max_wait_s``, :class:`BudgetStalled`
        when none can come.
        """
        permit = await self.acquire(method, channel, ticket=ticket, max_wait_s=max_wait_s)
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
        """:meth:`slot` without the block: the caller must :meth:`Permit.release` the permit.

        A permit of ``method`` the caller passed down with :func:`prepaid` is returned at once,
        spent (a retry of the same call queues again)."""
        passed = _take_prepaid(method)
        if passed is not None:
            return passed
        t = ticket or current_ticket()
        now = self.clock()
        buckets = self._buckets_for(method, channel)
        self._check_not_holding(method, buckets)
        waiter = _Waiter(
            priority=int(t.priority),
            since=now if t.since is None else t.since,
            seq=next(self._seq),
            method=method,
            buckets=buckets,
            holds=(method, ALL_CALLS),
            deadline=None if max_wait_s is None else now + max_wait_s,
            queued_at=now,
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
        except BudgetStalled:
            raise BudgetStalled(
                f"{self.name} rate budget: no {method} slot can come (its bucket is full of calls and "
                f"none completed for {self.stall_after_s:g} s)"
            ) from None
        except BudgetTimeout:
            raise BudgetTimeout(f"no {method} slot within {max_wait_s:.1f} s") from None
        self.granted[method] = self.granted.get(method, 0) + 1
        return Permit(self, method, buckets, self.clock() - now)

    def _check_not_holding(self, method: str, buckets: tuple[_Bucket, ...]) -> None:
        """Report a wait that starts while the caller still holds an unspent permit on one of the
        same buckets (the rule in the module docstring): it can wait for its own token."""
        held = _PREPAID.get()
        if held is None or held.released or held._budget is not self:
            return
        if not set(held._buckets) & set(buckets):
            return
        self._report(
            "wait_while_holding",
            (method, held.method),
            "a %s call waits for a slot while its caller holds an unspent %s permit of the same "
            "bucket (it may wait for its own token)",
            method,
            held.method,
        )

    def _report(self, kind: str, key: tuple[str, str], message: str, *args: object) -> None:
        """A broken budget rule: an ERROR line (once per ``key``) and the problem counter (always)."""
        RATE_BUDGET_PROBLEMS.labels(self.name, kind).inc()
        if key not in self._reported:
            self._reported.add(key)
            logger.error("%s rate budget: %s", self.name, message % args)

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
        self._moved_at = now
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
                    self._moved_at = now
                    granted = True
                    break  # buckets changed: look again from the best waiter
        wake: float | None = None
        for waiter in list(self._waiters):
            if waiter.deadline is not None and waiter.deadline <= now:
                self._waiters.remove(waiter)
                waiter.future.set_exception(BudgetTimeout())
                continue
            ready = self._ready_at(waiter)
            stuck_at = None
            if ready is None:  # its bucket is full of calls: only a release can wake it
                stuck_at = max(self._moved_at, waiter.queued_at) + self.stall_after_s
                if stuck_at <= now:
                    self._stalled(waiter, now)
                    continue
            for at in (ready, waiter.deadline, stuck_at):
                if at is not None and (wake is None or at < wake):
                    wake = at
        if wake is not None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(max(0.0, wake - now), self._dispatch)

    def _stalled(self, waiter: _Waiter, now: float) -> None:
        """Fail a wait that cannot end (see the module docstring): no call of its full bucket
        completed for ``stall_after_s``."""
        self._waiters.remove(waiter)
        self.stalled += 1
        full = [b for b in waiter.buckets if b.ready_at() is None]
        self._report(
            "stalled",
            ("stalled", waiter.method),
            "a %s call waited %.0f s for a slot that cannot come: %d call(s) in flight fill its "
            "bucket and none completed for %.0f s; failing the wait (a bug: some caller holds its "
            "permit while it waits, or a call never ends)",
            waiter.method,
            now - waiter.queued_at,
            max((b.in_flight for b in full), default=0),
            now - self._moved_at,
        )
        waiter.future.set_exception(BudgetStalled())
