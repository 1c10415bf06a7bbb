"""Admission control by lane, in front of any engine.

Why this exists: vLLM's ``priority`` scheduling policy only reorders its *waiting* queue. Once
background requests are admitted, their prefill chunks fill every scheduler step (up to
``max_num_batched_tokens``, ~150 ms each for an 8B model), and an urgent request that arrives
then waits for those steps: raw vLLM measured 313-331 ms urgent TTFT with 56 long requests
running. The bot knows which requests are urgent, so it paces what it hands the engine:

- **prefill pacing**: the requests of a lane admitted but still before their first token bring at
  most ``max_prefill_tokens[lane]`` new prompt tokens (those the prefix cache does not hold, as
  estimated from the shared prefix with the scenario's previous prompt) and number at most
  ``max_prefilling[lane]``. A burst of long prompts then enters the engine a few requests per
  step, every step stays short, and an urgent arrival is scheduled in the next step; a burst of
  mentions that share the cached system prompt (~100 new tokens each) goes in at once, as raw
  vLLM would take it. The same work still runs at full batch width once its prefill is done.
- **urgent hold**: while an urgent request waits here or is still before its first token, no
  background request is admitted at all (``hold_background_while_urgent_prefills``), and the
  background lane's in-flight count may be capped (``background_max_in_flight_when_urgent``).
- **reserved slots**: per-lane ``max_in_flight`` below the engine's ``max_num_seqs`` keeps batch
  slots free for urgent work, because vLLM never preempts a running request to make room for
  a higher-priority one when only the sequence limit is reached.
- **KV headroom** (``background_kv_watermark``, off by default): while the engine's KV cache is at
  least that full, no background request is admitted, so KV pages stay free for urgent work
  instead of going to background requests that would be preempted again.

Nothing already admitted is ever aborted or requeued: no work is lost, it only starts later.
Queues are bounded per lane; a full queue or a wait past ``queue_timeout_s`` raises
:class:`EngineOverloadedError`.

**Runtime tuning**: the configuration gives each lane's starting ``max_in_flight``; while running,
:meth:`AdmissionController.set_limit` changes it and :meth:`AdmissionController.set_max_tokens_cap`
shortens the answers of a lane (the bot's SLO guard, ``bot/slo.py``, does both to the background
lane while urgent TTFT is over target). Lowering a limit never aborts admitted work; raising one
admits waiting requests at once.

:class:`AdmittedEngine` is also the one layer that enforces the request deadline
(``engine.request_timeout_s``), for every backend alike: a generation still running that long
after its admission is aborted in the inner engine and fails with :class:`RequestTimeoutError`.

And it is the engine's **watchdog** (``engine.stall_timeout_s``): when requests are in flight and
the engine produced no event for any of them for that long, and showed no computing either
(:meth:`Engine.computing_at`: a CPU engine evaluating a long prompt yields no token for a while), the
engine is hung. The inner engine is told (:meth:`Engine.declare_dead`: it fails what it runs and
restarts or gives up, as for a crash) and every stalled stream fails with
:class:`EngineDeadError`. A request that is only waiting its turn inside the engine is not stalled
while others make progress.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from inference.config import AdmissionConfig
from inference.engine import (
    ChatMessage,
    ChatTokenizer,
    Engine,
    EngineDeadError,
    EngineHealth,
    EngineOverloadedError,
    EngineStats,
    GenerationEvent,
    GenerationRequest,
    GenerationResult,
    Lane,
    RequestAbortedError,
    RequestTimeoutError,
)

logger = logging.getLogger(__name__)

LANE_ORDER: tuple[Lane, ...] = (Lane.URGENT, Lane.NORMAL, Lane.BACKGROUND)
"""Lanes in the order free capacity is offered to them."""
_KV_RECHECK_S = 0.05
"""How often background work held by the KV watermark is looked at again (about an engine step)."""


PREFIX_BLOCK_TOKENS = 16
"""Tokens per KV block: vLLM's prefix cache reuses whole blocks only (its default block size)."""


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists (slice comparisons run in C)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n - 1  # a[:lo] == b[:lo] holds, a[:hi + 1] != b[:hi + 1]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


QueueListener = Callable[[Mapping[Lane, int], Mapping[Lane, int]], None]
"""Called with (queued per lane, in flight per lane) whenever either changes."""


class Ticket:
    """One admitted request's hold on its lane; release it exactly once (``release`` is idempotent)."""

    __slots__ = ("_controller", "_prefilling", "_released", "lane", "new_tokens", "request_id", "waited_s")

    def __init__(
        self,
        controller: AdmissionController,
        lane: Lane,
        request_id: str,
        waited_s: float,
        new_tokens: int = 0,
    ) -> None:
        self._controller = controller
        self._prefilling = True
        self._released = False
        self.lane = lane
        self.request_id = request_id
        self.waited_s = waited_s
        """Seconds the request waited for admission."""
        self.new_tokens = new_tokens
        """Prompt tokens the engine has to prefill (not in its prefix cache, as estimated)."""

    def first_token(self) -> None:
        """The engine produced the request's first token: its prefill no longer counts."""
        if self._prefilling and not self._released:
            self._prefilling = False
            self._controller._prefill_done(self.lane, self.new_tokens)

    def release(self) -> None:
        """The request finished, failed or was aborted: free its slot."""
        if not self._released:
            self._released = True
            self._controller._release(self.lane, self._prefilling, self.new_tokens)
            self._prefilling = False


@dataclass(eq=False, slots=True)
class _Waiter:
    lane: Lane
    request_id: str
    future: asyncio.Future[None]
    queued_at: float
    new_tokens: int = 0


class AdmissionController:
    """Per-lane in-flight limits, prefill pacing and bounded FIFO queues (see the module doc).

    Pure asyncio bookkeeping, no engine: :class:`AdmittedEngine` drives it around an engine's
    ``generate``, and the unit tests drive it directly.
    """

    def __init__(
        self,
        config: AdmissionConfig | None = None,
        *,
        on_change: QueueListener | None = None,
        kv_usage: Callable[[], float | None] | None = None,
    ) -> None:
        """``kv_usage()`` reads the engine's KV-cache use (0-1, ``None``: unknown) for the KV
        watermark; ``on_change`` hears every queue / in-flight change."""
        self.config = config or AdmissionConfig()
        self._on_change = on_change
        self._kv_usage = kv_usage
        self._kv_recheck: asyncio.TimerHandle | None = None
        self._queues: dict[Lane, deque[_Waiter]] = {lane: deque() for lane in LANE_ORDER}
        self._in_flight: dict[Lane, int] = dict.fromkeys(LANE_ORDER, 0)
        self._prefilling: dict[Lane, int] = dict.fromkeys(LANE_ORDER, 0)
        self._prefill_tokens: dict[Lane, int] = dict.fromkeys(LANE_ORDER, 0)
        """New prompt tokens of each lane's requests admitted and before their first token."""
        self._limits: dict[Lane, int | None] = {
            lane: self.config.max_in_flight.get(lane) for lane in LANE_ORDER
        }
        self._max_tokens_caps: dict[Lane, int | None] = dict.fromkeys(LANE_ORDER)
        self._closed: str | None = None

    # --- observation ---------------------------------------------------------------------------

    @property
    def queue_depths(self) -> dict[str, int]:
        """Requests waiting for admission, per lane name (for ``/metrics``)."""
        return {lane.value: len(q) for lane, q in self._queues.items()}

    @property
    def in_flight(self) -> dict[str, int]:
        """Requests admitted and not finished, per lane name."""
        return {lane.value: n for lane, n in self._in_flight.items()}

    @property
    def prefilling(self) -> dict[str, int]:
        """Requests admitted that have not had their first token yet, per lane name."""
        return {lane.value: n for lane, n in self._prefilling.items()}

    # --- runtime tuning ------------------------------------------------------------------------

    def limit(self, lane: Lane) -> int | None:
        """The lane's current in-flight limit (``None``: unlimited)."""
        return self._limits[Lane(lane)]

    def configured_limit(self, lane: Lane) -> int | None:
        """The lane's in-flight limit as configured (what :meth:`set_limit` changes at run time)."""
        return self.config.max_in_flight.get(Lane(lane))

    def set_limit(self, lane: Lane, max_in_flight: int | None) -> None:
        """Change the lane's in-flight limit now (``None``: unlimited). Requests already admitted keep
        running when it is lowered; waiting ones are admitted at once when it is raised."""
        if max_in_flight is not None and max_in_flight < 1:
            raise ValueError(f"the {Lane(lane).value} lane's limit must be at least 1 (or None)")
        self._limits[Lane(lane)] = max_in_flight
        self._pump()

    def max_tokens_cap(self, lane: Lane) -> int | None:
        """Most tokens an answer admitted in ``lane`` may generate now (``None``: its own ``max_tokens``)."""
        return self._max_tokens_caps[Lane(lane)]

    def set_max_tokens_cap(self, lane: Lane, cap: int | None) -> None:
        """Shorten the answers of requests admitted in ``lane`` from now on to ``cap`` tokens at most
        (``None``: no cap). Requests already running keep their length."""
        if cap is not None and cap < 1:
            raise ValueError(f"the {Lane(lane).value} lane's max_tokens cap must be at least 1 (or None)")
        self._max_tokens_caps[Lane(lane)] = cap

    def _notify(self) -> None:
        if self._on_change is not None:
            try:
                self._on_change({lane: len(q) for lane, q in self._queues.items()}, dict(self._in_flight))
            except Exception:  # a metrics callback must never break admission
                logger.exception("admission queue listener failed")

    # --- the rules -----------------------------------------------------------------------------

    def _urgent_pending(self) -> bool:
        return bool(self._queues[Lane.URGENT]) or self._prefilling[Lane.URGENT] > 0

    def _may_admit(self, lane: Lane, new_tokens: int = 0) -> bool:
        cfg = self.config
        limit = self._limits[lane]
        if limit is not None and self._in_flight[lane] >= limit:
            return False
        prefill_limit = cfg.max_prefilling.get(lane)
        if prefill_limit is not None and self._prefilling[lane] >= prefill_limit:
            return False
        token_budget = cfg.max_prefill_tokens.get(lane)
        if (
            token_budget is not None
            and self._prefilling[lane] > 0  # a prompt larger than the budget still goes in alone
            and self._prefill_tokens[lane] + new_tokens > token_budget
        ):
            return False
        if lane is Lane.BACKGROUND:
            if cfg.hold_background_while_urgent_prefills and self._urgent_pending():
                return False
            if self._kv_full():
                return False
            cap = cfg.background_max_in_flight_when_urgent
            urgent_active = bool(self._queues[Lane.URGENT]) or self._in_flight[Lane.URGENT] > 0
            if cap is not None and urgent_active and self._in_flight[lane] >= cap:
                return False
        return True

    def _kv_full(self) -> bool:
        """The KV watermark holds background work back; re-checked shortly (KV use changes every
        engine step, with no event here to wake the queue)."""
        watermark = self.config.background_kv_watermark
        if watermark is None or self._kv_usage is None:
            return False
        usage = self._kv_usage()
        if usage is None or usage < watermark:
            return False
        if self._kv_recheck is None:
            self._kv_recheck = asyncio.get_running_loop().call_later(_KV_RECHECK_S, self._kv_rechecked)
        return True

    def _kv_rechecked(self) -> None:
        self._kv_recheck = None
        self._pump()

    def _grant(self, lane: Lane, new_tokens: int = 0) -> None:
        self._in_flight[lane] += 1
        self._prefilling[lane] += 1
        self._prefill_tokens[lane] += new_tokens

    def _pump(self) -> None:
        """Admit queued requests, most urgent lane first, FIFO within a lane."""
        changed = False
        for lane in LANE_ORDER:
            queue = self._queues[lane]
            while queue and queue[0].future.done():  # cancelled or timed out: already accounted for
                queue.popleft()
            while queue and self._may_admit(lane, queue[0].new_tokens):
                waiter = queue.popleft()
                if waiter.future.done():
                    continue
                self._grant(lane, waiter.new_tokens)
                waiter.future.set_result(None)
                changed = True
        if changed:
            self._notify()

    # --- the API -------------------------------------------------------------------------------

    async def acquire(self, lane: Lane, request_id: str, new_tokens: int = 0) -> Ticket:
        """Wait for a slot in ``lane`` for a request with ``new_tokens`` prompt tokens to prefill;
        :class:`EngineOverloadedError` if the queue is full or the wait times out,
        :class:`RequestAbortedError` if the controller is closed meanwhile."""
        if self._closed is not None:
            raise RequestAbortedError(self._closed)
        lane = Lane(lane)
        start = time.perf_counter()
        queue = self._queues[lane]
        # Nobody ahead in this lane and room now: no queueing (and no event-loop round trip).
        if not queue and self._may_admit(lane, new_tokens):
            self._grant(lane, new_tokens)
            self._notify()
            return Ticket(self, lane, request_id, 0.0, new_tokens)
        max_queue = self.config.max_queue.get(lane)
        if max_queue is not None and len(queue) >= max_queue:
            raise EngineOverloadedError(
                f"the {lane.value} lane is full ({len(queue)} requests waiting); try again in a minute"
            )
        waiter = _Waiter(lane, request_id, asyncio.get_running_loop().create_future(), start, new_tokens)
        queue.append(waiter)
        self._notify()
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), self.config.queue_timeout_s)
        except (TimeoutError, asyncio.CancelledError) as exc:
            if waiter.future.done() and not waiter.future.cancelled() and waiter.future.exception() is None:
                # Granted in the same instant the wait ended: give the slot back.
                Ticket(self, lane, request_id, 0.0, new_tokens).release()
            else:
                waiter.future.cancel()
                with contextlib.suppress(ValueError):
                    queue.remove(waiter)
                self._notify()
            if isinstance(exc, TimeoutError):
                raise EngineOverloadedError(
                    f"waited {self.config.queue_timeout_s:.0f} s for a free slot in the {lane.value} lane; "
                    "the engine is busy, try again shortly"
                ) from None
            raise
        return Ticket(self, lane, request_id, time.perf_counter() - start, new_tokens)

    def cancel(self, request_id: str) -> bool:
        """Fail a queued request with :class:`RequestAbortedError`; ``False`` if it is not queued."""
        for queue in self._queues.values():
            for waiter in queue:
                if waiter.request_id == request_id and not waiter.future.done():
                    waiter.future.set_exception(RequestAbortedError(f"request {request_id} was aborted"))
                    queue.remove(waiter)
                    self._notify()
                    return True
        return False

    def close(self, reason: str = "the engine is shutting down") -> None:
        """Refuse new requests and fail every queued one with :class:`RequestAbortedError`."""
        self._closed = reason
        if self._kv_recheck is not None:
            self._kv_recheck.cancel()
            self._kv_recheck = None
        for queue in self._queues.values():
            while queue:
                waiter = queue.popleft()
                if not waiter.future.done():
                    waiter.future.set_exception(RequestAbortedError(reason))
        self._notify()

    def _prefill_done(self, lane: Lane, new_tokens: int = 0) -> None:
        self._prefilling[lane] -= 1
        self._prefill_tokens[lane] -= new_tokens
        self._pump()

    def _release(self, lane: Lane, prefilling: bool, new_tokens: int = 0) -> None:
        self._in_flight[lane] -= 1
        if prefilling:
            self._prefilling[lane] -= 1
            self._prefill_tokens[lane] -= new_tokens
        self._notify()
        self._pump()


class AdmittedEngine(Engine):
    """Any :class:`Engine` behind an :class:`AdmissionController` and the request deadline.

    ``generate`` waits for admission in the request's lane, then streams from the inner engine
    (which maps the lane to a vLLM priority itself) until ``request_timeout_s`` after admission.
    The admission wait is added to the result's ``queue_ms``, ``ttft_ms`` and ``e2e_ms``, which
    count from this ``generate`` call.
    """

    def __init__(
        self,
        inner: Engine,
        config: AdmissionConfig | None = None,
        *,
        request_timeout_s: float | None = None,
        stall_timeout_s: float | None = None,
        on_queue_change: QueueListener | None = None,
    ) -> None:
        self.inner = inner
        self.controller = AdmissionController(
            config, on_change=on_queue_change, kv_usage=lambda: inner.stats().kv_cache_usage
        )
        self.request_timeout_s = request_timeout_s
        self.stall_timeout_s = stall_timeout_s
        """Seconds without any event from the engine, while requests are in flight, that make it hung."""
        self.backend = inner.backend
        self.stalls = 0
        """Times the watchdog found the engine hung."""
        self._streaming = 0
        self._progress_at = 0.0
        self._last_prompt: dict[str, list[int]] = {}
        """Each scenario's latest prompt ids (what the prefix cache most likely holds)."""

    async def start(self, warmup_messages: Sequence[ChatMessage] = ()) -> None:
        """Start the inner engine (with its warm-up)."""
        await self.inner.start(warmup_messages)

    def _new_tokens(self, request: GenerationRequest) -> int:
        """The prompt tokens the engine will have to prefill, estimated: those after the longest
        prefix (in whole KV blocks) shared with the scenario's previous prompt, which the prefix
        cache holds (the system prompt, and a thread's earlier turns). 0 without token ids."""
        if not request.prompt_token_ids:
            return 0
        ids = list(request.prompt_token_ids)
        previous = self._last_prompt.get(request.scenario)
        self._last_prompt[request.scenario] = ids
        if previous is None:
            return len(ids)
        return len(ids) - common_prefix(ids, previous) // PREFIX_BLOCK_TOKENS * PREFIX_BLOCK_TOKENS

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        """Admit by lane, then stream the inner engine's events (see the class doc)."""
        t0 = time.perf_counter()
        ticket = await self.controller.acquire(request.lane, request.request_id, self._new_tokens(request))
        try:
            cap = self.controller.max_tokens_cap(request.lane)
            if cap is not None and request.sampling.max_tokens > cap:
                logger.debug(
                    "max_tokens %d capped to %d",
                    request.sampling.max_tokens,
                    cap,
                )
                request = replace(request, sampling=replace(request.sampling, max_tokens=cap))
            # Pacing delays background requests by design; only long waits are news.
            if ticket.waited_s > 1.0:
                logger.info(
                    "request admitted after %.0f ms in the %s lane",
                    ticket.waited_s * 1e3,
                    request.lane.value,
                )
            offset_ms = (time.perf_counter() - t0) * 1e3
            stream = self.inner.generate(request)
            loop = asyncio.get_running_loop()
            timeout = self.request_timeout_s
            deadline = None if timeout is None else loop.time() + timeout
            if self._streaming == 0:  # idle time before this request is no stall
                self._progress_at = loop.time()
            self._streaming += 1
            try:
                while True:
                    try:
                        event = await self._next(stream, request.request_id, deadline)
                    except StopAsyncIteration:
                        break
                    except TimeoutError:
                        assert timeout is not None
                        logger.warning(
                            "request aborted: still running %.0f s after admission",
                            timeout,
                        )
                        raise RequestTimeoutError(request.request_id, timeout) from None
                    self._progress_at = loop.time()
                    ticket.first_token()
                    if isinstance(event, GenerationResult):
                        event = replace(
                            event,
                            queue_ms=event.queue_ms + offset_ms,
                            ttft_ms=None if event.ttft_ms is None else event.ttft_ms + offset_ms,
                            e2e_ms=event.e2e_ms + offset_ms,
                        )
                    yield event
            finally:
                self._streaming -= 1
                # Closing the inner stream aborts the request there when it has not finished.
                aclose = getattr(stream, "aclose", None)
                if aclose is not None:
                    await aclose()
        finally:
            ticket.release()

    async def _next(
        self, stream: AsyncIterator[GenerationEvent], request_id: str, deadline: float | None
    ) -> GenerationEvent:
        """The stream's next event; ``TimeoutError`` at ``deadline``; :class:`EngineDeadError` when
        the watchdog finds the engine hung while waiting for it."""
        stall = self.stall_timeout_s
        if stall is None:
            async with asyncio.timeout_at(deadline):
                return await anext(stream)
        loop = asyncio.get_running_loop()
        # The next event is awaited in its own task: a stall check must not cancel (and so abort) it.
        pending = asyncio.ensure_future(anext(stream))
        try:
            while True:
                wake = self._progress_at + stall
                if deadline is not None:
                    wake = min(wake, deadline)
                done, _ = await asyncio.wait({pending}, timeout=max(0.0, wake - loop.time()))
                if done:
                    return pending.result()
                now = loop.time()
                if deadline is not None and now >= deadline:
                    raise TimeoutError
                if now - self._progress_at >= stall:
                    # No token, but the engine may still be computing (a long or CPU-starved prompt).
                    computing = self.inner.computing_at()
                    computed_s = None if computing is None else time.monotonic() - computing
                    if computed_s is None or computed_s >= stall:
                        raise self._hung(request_id, now - self._progress_at)
                    self._progress_at = now - computed_s  # (the loop's clock need not be monotonic())
                # Another request's tokens arrived meanwhile, or the engine is still computing: this
                # one only waits its turn.
        finally:
            if not pending.done():
                pending.cancel()
                with contextlib.suppress(BaseException):
                    await pending

    def _hung(self, request_id: str, silent_s: float) -> EngineDeadError:
        reason = f"no token for {silent_s:.1f} s (engine.stall_timeout_s = {self.stall_timeout_s:g})"
        if self.inner.health().ready:  # the first stalled stream tells the engine; the rest only fail
            self.stalls += 1
            logger.error("engine watchdog: the engine is hung (%s); handling it as dead", reason)
            if not self.inner.declare_dead(f"hung: {reason}"):
                logger.error(
                    "the %s engine cannot be restarted in-process; only its requests fail", self.backend
                )
        return EngineDeadError(f"the model engine is hung ({reason}); request {request_id} stopped")

    def declare_dead(self, reason: str) -> bool:
        """Tell the inner engine (see :meth:`Engine.declare_dead`)."""
        return self.inner.declare_dead(reason)

    async def abort(self, request_id: str) -> None:
        """Drop the request from its admission queue, or abort it in the inner engine."""
        if not self.controller.cancel(request_id):
            await self.inner.abort(request_id)

    def health(self) -> EngineHealth:
        """The inner engine's health."""
        return self.inner.health()

    def stats(self) -> EngineStats:
        """The inner engine's stats with admission queue depth and in-flight counts per lane."""
        stats = self.inner.stats()
        stats.waiting_by_lane = self.controller.queue_depths
        stats.running_by_lane = self.controller.in_flight
        return stats

    async def shutdown(self, drain_timeout_s: float = 30.0) -> None:
        """Refuse and fail queued requests, then let the inner engine drain and stop."""
        self.controller.close()
        await self.inner.shutdown(drain_timeout_s)

    @property
    def tokenizer(self) -> ChatTokenizer:
        """The inner engine's tokenizer."""
        return self.inner.tokenizer
