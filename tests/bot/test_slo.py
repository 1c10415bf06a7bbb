"""The SLO guard driven by synthetic streams of latencies (breach, hold, recover, flapping) on a
synthetic clock, acting on a real AdmissionController and posting through a real adapter."""

from __future__ import annotations

import io
from typing import Any

import pytest
from prometheus_client import REGISTRY

from bot.adapters.console import ConsoleAdapter
from bot.config import ConfigError, SloSettings, load_settings
from bot.slo import LaneState, SloGuard
from inference.admission import AdmissionController
from inference.config import AdmissionConfig
from inference.engine import Lane

SLOW, FAST, MIDDLE = 3.0, 0.2, 1.8
"""Seconds of TTFT: over the 2 s target, well under it (healthy), under it but above 0.8 x target."""


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def actions_total(action: str, direction: str) -> float:
    return (
        REGISTRY.get_sample_value("opsbot_slo_actions_total", {"action": action, "direction": direction})
        or 0.0
    )


def make_guard(clock: Clock, **overrides: Any) -> tuple[SloGuard, AdmissionController, io.StringIO]:
    settings = SloSettings(ops_channel="console:ops", **overrides)
    controller = AdmissionController(AdmissionConfig())
    guard = SloGuard(settings, controller, clock=clock)
    out = io.StringIO()
    guard.attach({"console": ConsoleAdapter(stdin=io.StringIO(""), stdout=out)})
    return guard, controller, out


def feed(guard: SloGuard, clock: Clock, ttft_s: float, count: int = 30, lane: Lane = Lane.URGENT) -> None:
    """``count`` answers of ``ttft_s`` over the next few seconds."""
    for _ in range(count):
        clock.advance(0.1)
        guard.observe(lane, ttft_s)


def warnings(out: io.StringIO) -> int:
    return out.getvalue().count("opsbot SLO breach")


async def test_a_breach_warns_once_and_tightens_the_background_lane_on_the_live_controller() -> None:
    clock = Clock()
    guard, controller, out = make_guard(clock)
    before = actions_total("warn", "tighten")
    feed(guard, clock, SLOW)
    actions = await guard.tick()
    assert [a.action for a in actions] == ["background_in_flight", "background_max_tokens", "warn"]
    assert guard.level == 1
    assert controller.limit(Lane.BACKGROUND) == 32 and controller.max_tokens_cap(Lane.BACKGROUND) == 256
    assert controller.limit(Lane.URGENT) == 64 and controller.limit(Lane.NORMAL) == 56  # untouched
    assert warnings(out) == 1
    assert "urgent P99 3.00 s over the 2.00 s target (30 answers)" in out.getvalue()
    assert actions_total("warn", "tighten") - before == 1
    assert REGISTRY.get_sample_value("opsbot_admission_max_in_flight", {"lane": "background"}) == 32
    assert REGISTRY.get_sample_value("opsbot_slo_breached", {"lane": "urgent"}) == 1


async def test_a_breach_that_holds_tightens_one_step_per_interval_up_to_the_last_and_warns_only_once() -> (
    None
):
    clock = Clock()
    guard, controller, out = make_guard(clock)
    feed(guard, clock, SLOW)
    await guard.tick()
    seen = [(guard.level, controller.limit(Lane.BACKGROUND), controller.max_tokens_cap(Lane.BACKGROUND))]
    for _ in range(8):  # every 10 s for 80 s: a step is due every 30 s
        clock.advance(10)
        feed(guard, clock, SLOW, count=5)
        await guard.tick()
        seen.append(
            (guard.level, controller.limit(Lane.BACKGROUND), controller.max_tokens_cap(Lane.BACKGROUND))
        )
    levels = [level for level, _, _ in seen]
    assert levels == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert seen[-1] == (3, 4, 64)
    assert warnings(out) == 1


async def test_recovery_undoes_the_steps_one_hold_at_a_time_and_says_so_once() -> None:
    clock = Clock()
    guard, controller, out = make_guard(clock, step_interval_s=0)
    feed(guard, clock, SLOW)
    for _ in range(3):
        clock.advance(1)
        await guard.tick()
    assert guard.level == 3
    relaxed_before = actions_total("background_in_flight", "relax")
    clock.advance(121)  # the slow answers leave the window
    feed(guard, clock, FAST)
    levels = []
    for _ in range(14):  # every 15 s for 210 s: one undo per 60 s of health
        await guard.tick()
        levels.append(guard.level)
        clock.advance(15)
        feed(guard, clock, FAST, count=2)
    assert levels == [3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0]
    assert controller.limit(Lane.BACKGROUND) == 56 and controller.max_tokens_cap(Lane.BACKGROUND) is None
    assert actions_total("background_in_flight", "relax") - relaxed_before == 3
    assert out.getvalue().count("opsbot SLO recovered") == 1
    assert warnings(out) == 1


async def test_a_p99_just_under_the_target_holds_the_steps_instead_of_undoing_them() -> None:
    clock = Clock()
    guard, controller, _ = make_guard(clock)
    feed(guard, clock, SLOW)
    await guard.tick()
    clock.advance(121)
    for _ in range(20):  # 5 minutes at 1.8 s: under 2 s, above the 1.6 s recovery line
        feed(guard, clock, MIDDLE, count=5)
        clock.advance(15)
        await guard.tick()
    assert guard.snapshot().lanes[0].state is LaneState.HOLDING
    assert guard.level == 1 and controller.limit(Lane.BACKGROUND) == 32


async def test_a_flapping_p99_posts_one_warning_never_relaxes_while_flapping_and_recovers_after() -> None:
    clock = Clock()
    guard, controller, out = make_guard(clock, window_s=2.5, min_samples=5)
    levels, states = [], []
    for i in range(40):  # every 3 s the window holds only the last second: slow, fast, slow, ...
        feed(guard, clock, SLOW if i % 2 == 0 else FAST, count=10)
        await guard.tick()
        levels.append(guard.level)
        states.append(guard.snapshot().lanes[0].state)
        clock.advance(2)
    assert set(states) == {LaneState.BREACHED, LaneState.HEALTHY}
    assert warnings(out) == 1
    assert levels == sorted(levels), "the guard relaxed while the P99 was still flapping"
    assert levels[-1] == 3
    for _ in range(30):  # then steady health for 5 minutes
        feed(guard, clock, FAST, count=10)
        await guard.tick()
        clock.advance(9)
    assert guard.level == 0 and controller.limit(Lane.BACKGROUND) == 56
    assert warnings(out) == 1 and out.getvalue().count("opsbot SLO recovered") == 1


async def test_a_second_breach_within_the_cooldown_acts_but_does_not_warn_again() -> None:
    clock = Clock()
    guard, _, out = make_guard(clock, step_interval_s=0, recover_hold_s=0, warning_cooldown_s=900)
    for episode in range(3):
        feed(guard, clock, SLOW)
        await guard.tick()
        assert guard.level == 1
        clock.advance(121)
        feed(guard, clock, FAST)
        await guard.tick()
        assert guard.level == 0
        if episode == 1:
            clock.advance(900)  # the third episode is past the cooldown
    assert warnings(out) == 2
    # The second episode's warning was suppressed, so it posted no recovery note either.
    assert out.getvalue().count("opsbot SLO recovered") == 2


async def test_too_few_answers_or_an_unguarded_lane_never_trigger_the_guard() -> None:
    clock = Clock()
    guard, controller, out = make_guard(clock)
    feed(guard, clock, SLOW, count=19)  # min_samples is 20
    feed(guard, clock, 60.0, count=100, lane=Lane.BACKGROUND)  # background has no target
    await guard.tick()
    states = {r.lane: r.state for r in guard.snapshot().lanes}
    assert states == {
        Lane.URGENT: LaneState.UNKNOWN,
        Lane.NORMAL: LaneState.UNKNOWN,
        Lane.BACKGROUND: LaneState.UNGUARDED,
    }
    assert guard.level == 0 and controller.limit(Lane.BACKGROUND) == 56 and warnings(out) == 0


async def test_the_kv_cache_watermark_is_off_by_default_and_when_set_caps_the_lanes_after_the_hold() -> None:
    clock = Clock()
    usage = [0.99]
    off = SloGuard(SloSettings(), AdmissionController(), kv_usage=lambda: usage[0], clock=clock)
    clock.advance(100)
    assert off.evaluate() == [] and off.controller.limit(Lane.NORMAL) == 56

    controller = AdmissionController()
    guard = SloGuard(
        SloSettings(kv_cache_watermark=0.9, kv_cache_hold_s=30),
        controller,
        kv_usage=lambda: usage[0],
        clock=clock,
    )
    assert guard.evaluate() == []
    clock.advance(29)
    assert guard.evaluate() == []
    clock.advance(1)
    (action,) = guard.evaluate()
    assert (action.action, action.direction) == ("kv_in_flight", "tighten")
    assert controller.limit(Lane.NORMAL) == 32 and controller.limit(Lane.BACKGROUND) == 16
    assert controller.limit(Lane.URGENT) == 64
    usage[0] = 0.8  # under the watermark but above 0.8 x 0.9: no undo yet
    clock.advance(60)
    assert guard.evaluate() == [] and controller.limit(Lane.NORMAL) == 32
    usage[0] = 0.5
    guard.evaluate()
    clock.advance(30)
    (action,) = guard.evaluate()
    assert (action.action, action.direction) == ("kv_in_flight", "relax")
    assert controller.limit(Lane.NORMAL) == 56 and controller.limit(Lane.BACKGROUND) == 56


async def test_the_status_line_names_the_state_the_p99s_and_what_is_held_back() -> None:
    clock = Clock()
    guard, _, _ = make_guard(clock)
    assert guard.describe().startswith("SLO: ok")
    feed(guard, clock, SLOW)
    await guard.tick()
    line = guard.describe()
    assert line.startswith("SLO: BREACHED") and "urgent 3.00 s / 2.00 s" in line
    assert "guard step 1/3: background lane held to 32 in flight, answers of at most 256 tokens" in line


async def test_a_missing_ops_adapter_is_logged_and_the_guard_keeps_acting(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    controller = AdmissionController()
    guard = SloGuard(SloSettings(ops_channel="slack:C0OPS"), controller, clock=clock)
    feed(guard, clock, SLOW)
    await guard.tick()
    assert guard.level == 1 and "no slack adapter running" in caplog.text


def test_the_slo_settings_refuse_steps_that_disagree_or_grow_and_a_malformed_ops_channel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for env, needle in (
        ({"OPSBOT_SLO__BACKGROUND_MAX_TOKENS_STEPS": "[256, 128]"}, "same number"),
        ({"OPSBOT_SLO__BACKGROUND_MAX_IN_FLIGHT_STEPS": "[8, 16, 4]"}, "never grow"),
        ({"OPSBOT_SLO__OPS_CHANNEL": "C0OPS"}, "platform:channel"),
    ):
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        with pytest.raises(ConfigError, match=needle):
            load_settings()
        for key in env:
            monkeypatch.delenv(key)
