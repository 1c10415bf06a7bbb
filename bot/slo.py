"""The SLO guard: rolling P99 TTFT per lane against targets, and what opsbot does about a breach.

Every finished answer's TTFT goes into its lane's window (``slo.window_s``). Every
``slo.evaluate_interval_s`` the guard judges each lane that has a target and at least
``slo.min_samples`` answers in the window:

- **breached** (P99 over target): the guard takes one tightening step (at most one per
  ``slo.step_interval_s``, up to the last configured step): the background lane's in-flight limit
  and its answers' ``max_tokens`` drop to the step's values, on the live
  :class:`~inference.admission.AdmissionController`. The first step of an episode posts **one**
  warning to ``slo.ops_channel`` (none again within ``slo.warning_cooldown_s``, however often the
  P99 flaps); later steps are logged and counted only.
- **recovered** (every judged lane at or below ``recover_ratio`` x target, or too few answers to
  judge): after ``slo.recover_hold_s`` of that, one step is undone, and so on, one step per hold,
  back to the configured limits; the last undo posts a recovery note where the warning went.
- in between (under target but above the recovery line): nothing changes (hysteresis).

Optionally (``slo.kv_cache_watermark``, off by default) KV-cache use held at or above the
watermark for ``slo.kv_cache_hold_s`` lowers the normal and background lanes' in-flight limits
(vLLM's ``max_num_seqs``, enforced in front of the engine), undone the same way.

Every action and every undo is logged (WARNING when tightening, INFO when relaxing) and counted in
``opsbot_slo_actions_total{action, direction}``; the windows' P99s, the targets, the breach state and
the current limits are gauges (``opsbot_slo_*``, ``opsbot_admission_*``). Nothing admitted is ever
aborted: a lower limit only delays new background work. Time comes from ``clock`` (tests drive a
synthetic one).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from bot import metrics
from bot.adapters.base import ChatAdapter
from bot.config import SloSettings
from bot.event_loop import stop_task
from bot.store.records import percentile
from inference.admission import LANE_ORDER, AdmissionController, AdmittedEngine
from inference.engine import Engine, Lane

logger = logging.getLogger(__name__)

_MAX_SAMPLES = 20_000
"""Answers kept per lane window (memory bound under a storm; the newest are kept)."""


class LaneState(enum.StrEnum):
    """How one lane's rolling P99 TTFT stands against its target."""

    UNGUARDED = "unguarded"
    """No target configured."""
    UNKNOWN = "unknown"
    """Too few answers in the window to judge."""
    HEALTHY = "healthy"
    """At or below ``recover_ratio`` x target."""
    HOLDING = "holding"
    """Under the target but above the recovery line."""
    BREACHED = "breached"
    """Over the target."""


@dataclass(frozen=True, slots=True)
class LaneReading:
    """One lane's window at one evaluation."""

    lane: Lane
    samples: int
    p99_s: float | None
    target_s: float | None
    state: LaneState


@dataclass(slots=True)
class SloAction:
    """One thing the guard did (or undid), as logged and counted."""

    action: str
    """``warn``, ``recovered``, ``background_in_flight``, ``background_max_tokens`` or ``kv_in_flight``."""
    direction: str
    """``tighten`` or ``relax``."""
    detail: str


@dataclass(slots=True)
class SloSnapshot:
    """The guard's state for ``/rca status``."""

    lanes: list[LaneReading]
    level: int
    max_level: int
    kv_tight: bool
    limits: dict[str, int | None] = field(default_factory=dict)
    max_tokens_cap: int | None = None

    @property
    def breached(self) -> list[LaneReading]:
        """The lanes over their target."""
        return [r for r in self.lanes if r.state is LaneState.BREACHED]


def _s(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} s"


def _limit(value: int | None) -> str:
    return "unlimited" if value is None else str(value)


class SloGuard:
    """Watches TTFT per lane and tunes ``controller`` when the P99 breaches its target (module doc)."""

    def __init__(
        self,
        settings: SloSettings,
        controller: AdmissionController,
        *,
        kv_usage: Callable[[], float | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``kv_usage`` reads the engine's KV-cache use (0-1; only needed with a watermark)."""
        self.settings = settings
        self.controller = controller
        self.kv_usage = kv_usage
        self.clock = clock
        self.level = 0
        self.kv_tight = False
        self._windows: dict[Lane, deque[tuple[float, float]]] = {
            lane: deque(maxlen=_MAX_SAMPLES) for lane in LANE_ORDER
        }
        self._last_tighten: float | None = None
        self._healthy_since: float | None = None
        self._kv_above_since: float | None = None
        self._kv_below_since: float | None = None
        self._last_warning: float | None = None
        self._episode_warned = False
        self._outbox: list[str] = []
        self._adapters: Mapping[str, ChatAdapter] = {}
        self._task: asyncio.Task[None] | None = None
        for lane in LANE_ORDER:
            target = settings.ttft_p99_target_s.get(lane)
            if target is not None:
                metrics.SLO_TARGET.labels(lane.value).set(target)
            metrics.SLO_BREACHED.labels(lane.value).set(0)
        metrics.SLO_LEVEL.set(0)
        self._export_limits()

    @classmethod
    def for_engine(cls, settings: SloSettings, engine: Engine) -> SloGuard | None:
        """The guard for ``engine``'s admission controller; ``None`` when ``slo.enabled`` is off (or the
        engine has no admission layer to tune)."""
        if not settings.enabled or not isinstance(engine, AdmittedEngine):
            return None
        return cls(settings, engine.controller, kv_usage=lambda: engine.stats().kv_cache_usage)

    @property
    def max_level(self) -> int:
        """The number of tightening steps configured."""
        return len(self.settings.background_max_in_flight_steps)

    # -- input ----------------------------------------------------------------------------------
    def observe(self, lane: str, ttft_s: float, at: float | None = None) -> None:
        """Record one answer's time to first token (seconds) in ``lane``'s window."""
        self._windows[Lane(lane)].append((self.clock() if at is None else at, ttft_s))

    def attach(self, adapters: Mapping[str, ChatAdapter]) -> None:
        """The chat adapters by platform, so warnings can reach ``slo.ops_channel``."""
        self._adapters = dict(adapters)

    # -- judgement ------------------------------------------------------------------------------
    def readings(self, now: float | None = None) -> list[LaneReading]:
        """Every lane's window as of ``now`` (old answers are dropped from the windows here)."""
        now = self.clock() if now is None else now
        horizon = now - self.settings.window_s
        out: list[LaneReading] = []
        for lane in LANE_ORDER:
            window = self._windows[lane]
            while window and window[0][0] < horizon:
                window.popleft()
            values = sorted(v for _, v in window)
            p99 = percentile(values, 99)
            target = self.settings.ttft_p99_target_s.get(lane)
            if target is None:
                state = LaneState.UNGUARDED
            elif len(values) < self.settings.min_samples or p99 is None:
                state = LaneState.UNKNOWN
            elif p99 > target:
                state = LaneState.BREACHED
            elif p99 <= target * self.settings.recover_ratio:
                state = LaneState.HEALTHY
            else:
                state = LaneState.HOLDING
            out.append(LaneReading(lane, len(values), p99, target, state))
        return out

    def evaluate(self, now: float | None = None) -> list[SloAction]:
        """Judge the windows and act (see the module doc); returns what was done this time."""
        now = self.clock() if now is None else now
        readings = self.readings(now)
        self._export_readings(readings)
        actions: list[SloAction] = []
        breached = [r for r in readings if r.state is LaneState.BREACHED]
        calm = all(r.state in (LaneState.HEALTHY, LaneState.UNKNOWN, LaneState.UNGUARDED) for r in readings)
        if breached:
            self._healthy_since = None
            due = self._last_tighten is None or now - self._last_tighten >= self.settings.step_interval_s
            if self.level < self.max_level and due:
                actions += self._tighten(now, breached)
        elif calm and self.level > 0:
            if self._healthy_since is None:
                self._healthy_since = now
            if now - self._healthy_since >= self.settings.recover_hold_s:
                actions += self._relax(readings)
                self._healthy_since = now  # the next undo waits a full hold again
        elif not calm:
            self._healthy_since = None
        actions += self._watch_kv(now)
        return actions

    async def tick(self) -> list[SloAction]:
        """One evaluation, then post what it has to say to the ops channel."""
        actions = self.evaluate()
        await self.flush()
        return actions

    async def flush(self) -> None:
        """Post the queued warnings and notes to ``slo.ops_channel`` (failures are logged, not raised)."""
        outbox, self._outbox = self._outbox, []
        target = self.settings.ops_channel
        if not outbox or target is None:
            return
        platform, _, channel = target.partition(":")
        adapter = self._adapters.get(platform)
        if adapter is None:
            logger.warning(
                "SLO guard: no %s adapter running; ops message not posted: %s", platform, outbox[0]
            )
            return
        for text in outbox:
            try:
                await adapter.post_to_channel(channel, text)
            except Exception as exc:  # the guard must keep guarding when the ops channel is down
                logger.error("SLO guard: could not post to %s: %s", target, exc)

    # -- the loop -------------------------------------------------------------------------------
    def start(self) -> None:
        """Evaluate every ``slo.evaluate_interval_s`` in a background task until :meth:`stop`."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="opsbot-slo-guard")

    async def stop(self) -> None:
        """Stop the background evaluations (limits stay as they are: the engine stops next)."""
        await stop_task(self._task)
        self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.settings.evaluate_interval_s)
            try:
                await self.tick()
            except Exception:  # a bug here must not end the guard for the rest of the process
                logger.exception("SLO guard evaluation failed")

    # -- actions --------------------------------------------------------------------------------
    def _tighten(self, now: float, breached: list[LaneReading]) -> list[SloAction]:
        before_limit = self.controller.limit(Lane.BACKGROUND)
        before_cap = self.controller.max_tokens_cap(Lane.BACKGROUND)
        self.level += 1
        self._last_tighten = now
        self._apply()
        why = "; ".join(
            f"{r.lane.value} P99 {_s(r.p99_s)} over the {_s(r.target_s)} target ({r.samples} answers)"
            for r in breached
        )
        limit, cap = self.controller.limit(Lane.BACKGROUND), self.controller.max_tokens_cap(Lane.BACKGROUND)
        change = (
            f"background max_in_flight {_limit(before_limit)} -> {_limit(limit)}, "
            f"max_tokens cap {before_cap or 'none'} -> {cap}"
        )
        logger.warning("SLO guard: TTFT breach (%s): step %d/%d, %s", why, self.level, self.max_level, change)
        actions = [
            self._count("background_in_flight", "tighten", change),
            self._count("background_max_tokens", "tighten", change),
        ]
        if self.level == 1:
            actions += self._warn(now, why, change)
        return actions

    def _warn(self, now: float, why: str, change: str) -> list[SloAction]:
        cooldown = self.settings.warning_cooldown_s
        if self._last_warning is not None and now - self._last_warning < cooldown:
            logger.info("SLO guard: warning suppressed (last one %.0f s ago)", now - self._last_warning)
            self._episode_warned = False
            return []
        self._last_warning = now
        self._episode_warned = True
        recover = ", ".join(
            f"{r.lane.value} {_s(r.target_s * self.settings.recover_ratio)}"
            for r in self.readings(now)
            if r.target_s is not None
        )
        text = (
            f":warning: *opsbot SLO breach*: {why} in the last {self.settings.window_s:g} s. "
            f"Background work is being held back: {change}. Further steps every "
            f"{self.settings.step_interval_s:g} s while it lasts (up to {self.max_level}); undone step by "
            f"step once P99 TTFT stays under {recover} for {self.settings.recover_hold_s:g} s."
        )
        self._outbox.append(text)
        return [self._count("warn", "tighten", why)]

    def _relax(self, readings: list[LaneReading]) -> list[SloAction]:
        before_limit = self.controller.limit(Lane.BACKGROUND)
        before_cap = self.controller.max_tokens_cap(Lane.BACKGROUND)
        self.level -= 1
        self._apply()
        limit, cap = self.controller.limit(Lane.BACKGROUND), self.controller.max_tokens_cap(Lane.BACKGROUND)
        change = (
            f"background max_in_flight {_limit(before_limit)} -> {_limit(limit)}, "
            f"max_tokens cap {before_cap} -> {cap or 'none'}"
        )
        logger.info(
            "SLO guard: TTFT recovered, undoing a step (now %d/%d): %s", self.level, self.max_level, change
        )
        actions = [
            self._count("background_in_flight", "relax", change),
            self._count("background_max_tokens", "relax", change),
        ]
        if self.level == 0:
            self._last_tighten = None
            if self._episode_warned:
                self._episode_warned = False
                state = ", ".join(
                    f"{r.lane.value} {_s(r.p99_s)} (target {_s(r.target_s)})"
                    for r in readings
                    if r.target_s is not None
                )
                self._outbox.append(
                    f":white_check_mark: *opsbot SLO recovered*: P99 TTFT {state}. "
                    "Background admission is back to its configured limits."
                )
                actions.append(self._count("recovered", "relax", state))
        return actions

    def _watch_kv(self, now: float) -> list[SloAction]:
        watermark = self.settings.kv_cache_watermark
        if watermark is None or self.kv_usage is None:
            return []
        usage = self.kv_usage()
        if usage is None:
            return []
        hold = self.settings.kv_cache_hold_s
        if usage >= watermark:
            self._kv_below_since = None
            self._kv_above_since = self._kv_above_since if self._kv_above_since is not None else now
            if not self.kv_tight and now - self._kv_above_since >= hold:
                self.kv_tight = True
                self._apply()
                detail = f"KV-cache use {usage * 100:.0f} % >= {watermark * 100:.0f} % for {hold:.0f} s: " + (
                    self._limits_text()
                )
                logger.warning("SLO guard: %s", detail)
                return [self._count("kv_in_flight", "tighten", detail)]
            return []
        self._kv_above_since = None
        if usage > watermark * self.settings.recover_ratio:
            self._kv_below_since = None
            return []
        self._kv_below_since = self._kv_below_since if self._kv_below_since is not None else now
        if self.kv_tight and now - self._kv_below_since >= hold:
            self.kv_tight = False
            self._apply()
            detail = f"KV-cache use {usage * 100:.0f} % back under the watermark: " + self._limits_text()
            logger.info("SLO guard: %s", detail)
            return [self._count("kv_in_flight", "relax", detail)]
        return []

    def _apply(self) -> None:
        """Set the controller's limits and cap to what the current level and KV state call for."""
        s = self.settings
        for lane in LANE_ORDER:
            limit = self.controller.configured_limit(lane)
            if lane is Lane.BACKGROUND and self.level > 0:
                limit = _min(limit, s.background_max_in_flight_steps[self.level - 1])
            if self.kv_tight and lane in s.kv_cache_max_in_flight:
                limit = _min(limit, s.kv_cache_max_in_flight[lane])
            if self.controller.limit(lane) != limit:
                self.controller.set_limit(lane, limit)
        cap = s.background_max_tokens_steps[self.level - 1] if self.level > 0 else None
        self.controller.set_max_tokens_cap(Lane.BACKGROUND, cap)
        metrics.SLO_LEVEL.set(self.level)
        self._export_limits()

    def _limits_text(self) -> str:
        return ", ".join(
            f"{lane.value} max_in_flight {_limit(self.controller.limit(lane))}" for lane in LANE_ORDER
        )

    @staticmethod
    def _count(action: str, direction: str, detail: str) -> SloAction:
        metrics.SLO_ACTIONS.labels(action, direction).inc()
        return SloAction(action, direction, detail)

    # -- reporting ------------------------------------------------------------------------------
    def snapshot(self, now: float | None = None) -> SloSnapshot:
        """The current windows, level and limits."""
        return SloSnapshot(
            lanes=self.readings(now),
            level=self.level,
            max_level=self.max_level,
            kv_tight=self.kv_tight,
            limits={lane.value: self.controller.limit(lane) for lane in LANE_ORDER},
            max_tokens_cap=self.controller.max_tokens_cap(Lane.BACKGROUND),
        )

    def describe(self) -> str:
        """One line for ``/rca status``: the SLO state, each guarded lane's P99, what the guard holds back."""
        snap = self.snapshot()
        lanes = ", ".join(
            f"{r.lane.value} {_s(r.p99_s)} / {_s(r.target_s)}"
            + ("" if r.state is not LaneState.UNKNOWN else f" ({r.samples} answers, too few to judge)")
            for r in snap.lanes
            if r.target_s is not None
        )
        if snap.breached:
            state = "BREACHED"
        elif snap.level > 0 or snap.kv_tight:
            state = "recovering"
        else:
            state = "ok"
        line = (
            f"SLO: {state} — P99 TTFT over {self.settings.window_s:.0f} s vs target: {lanes or 'no targets'}"
        )
        if snap.level > 0:
            line += (
                f"; guard step {snap.level}/{snap.max_level}: background lane held to "
                f"{_limit(snap.limits.get(Lane.BACKGROUND.value))} in flight, "
                f"answers of at most {snap.max_tokens_cap} tokens"
            )
        if snap.kv_tight:
            line += "; KV-cache over the watermark: normal and background lanes capped"
        return line

    def _export_readings(self, readings: list[LaneReading]) -> None:
        for r in readings:
            if r.p99_s is None:
                with contextlib.suppress(KeyError):
                    metrics.SLO_TTFT_P99.remove(r.lane.value)
            else:
                metrics.SLO_TTFT_P99.labels(r.lane.value).set(r.p99_s)
            metrics.SLO_BREACHED.labels(r.lane.value).set(1 if r.state is LaneState.BREACHED else 0)

    def _export_limits(self) -> None:
        for lane in LANE_ORDER:
            limit = self.controller.limit(lane)
            if limit is None:
                with contextlib.suppress(KeyError):
                    metrics.LANE_LIMIT.remove(lane.value)
            else:
                metrics.LANE_LIMIT.labels(lane.value).set(limit)
            metrics.LANE_MAX_TOKENS_CAP.labels(lane.value).set(self.controller.max_tokens_cap(lane) or 0)


def _min(limit: int | None, cap: int) -> int:
    return cap if limit is None else min(limit, cap)
