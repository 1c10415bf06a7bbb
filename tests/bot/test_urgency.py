"""Urgent answers first on the bot's event loop (bot.urgency), alone and inside the pipeline."""

from __future__ import annotations

import asyncio
from typing import Any

from bot.urgency import UrgentFirst
from inference.engine import Lane


async def _pending_after(awaitable: Any, seconds: float) -> asyncio.Task[Any]:
    task = asyncio.ensure_future(awaitable)
    await asyncio.sleep(seconds)
    return task


async def test_background_waits_while_an_urgent_answer_holds_and_goes_on_at_its_release() -> None:
    gate = UrgentFirst(max_wait_s=30)
    hold = gate.hold(Lane.URGENT)
    assert hold is not None and gate.urgent_in_flight == 1
    background = await _pending_after(gate.step_aside(Lane.BACKGROUND), 0.05)
    assert not background.done()
    # Urgent work never steps aside, and neither do mentions and DMs: someone waits on them.
    await asyncio.wait_for(gate.step_aside(Lane.URGENT), 1)
    await asyncio.wait_for(gate.step_aside(Lane.NORMAL), 1)
    hold.release()
    hold.release()  # idempotent: the first words, then the answer's end
    await asyncio.wait_for(background, 1)
    assert gate.urgent_in_flight == 0


async def test_every_hold_must_end_before_other_lanes_go_on() -> None:
    gate = UrgentFirst(max_wait_s=30)
    first, second = gate.hold(Lane.URGENT), gate.hold(Lane.URGENT)
    assert first is not None and second is not None
    waiting = await _pending_after(gate.step_aside(Lane.BACKGROUND), 0.02)
    first.release()
    await asyncio.sleep(0.02)
    assert not waiting.done()
    second.release()
    await asyncio.wait_for(waiting, 1)


async def test_a_pause_is_bounded_so_a_stream_of_urgent_work_never_stops_the_rest() -> None:
    gate = UrgentFirst(max_wait_s=0.05)
    assert gate.hold(Lane.URGENT) is not None  # never released
    await asyncio.wait_for(gate.step_aside(Lane.BACKGROUND), 5)
    assert gate.urgent_in_flight == 1


async def test_zero_turns_it_off() -> None:
    gate = UrgentFirst(max_wait_s=0)
    assert gate.hold(Lane.URGENT) is None and gate.urgent_in_flight == 0
    await asyncio.wait_for(gate.step_aside(Lane.BACKGROUND), 1)


async def test_a_follow_up_waits_in_the_pipeline_for_an_urgent_answer_then_is_answered(parts: Any) -> None:
    parts.pipeline.urgent_first = UrgentFirst(max_wait_s=30)
    adapter = parts.adapter
    await adapter._submit(adapter.to_message("first question about api-gateway"))  # type: ignore[misc]
    answered = parts.out.getvalue().count("first token")
    hold = parts.pipeline.urgent_first.hold(Lane.URGENT)  # an urgent answer on its way
    follow = adapter.to_message("and what about the database?")
    task = await _pending_after(parts.pipeline.handle(follow, adapter), 0.3)
    assert not task.done() and parts.out.getvalue().count("first token") == answered
    assert hold is not None
    hold.release()
    await asyncio.wait_for(task, 60)
    assert parts.out.getvalue().count("first token") == answered + 1


async def test_an_urgent_answer_releases_its_hold(parts: Any) -> None:
    parts.pipeline.urgent_first = UrgentFirst(max_wait_s=30)
    adapter = parts.adapter
    await adapter._submit(adapter.to_message("hello"))  # type: ignore[misc]
    rca = adapter.to_message("/rca why is payments-api crashlooping?")
    await asyncio.wait_for(parts.pipeline.handle(rca, adapter), 60)
    assert "first token" in parts.out.getvalue()
    assert parts.pipeline.urgent_first.urgent_in_flight == 0


async def test_a_direct_question_never_waits_for_urgent_answers(parts: Any) -> None:
    parts.pipeline.urgent_first = UrgentFirst(max_wait_s=30)
    hold = parts.pipeline.urgent_first.hold(Lane.URGENT)  # never released in this test
    assert hold is not None
    direct = parts.adapter.to_message("which pods are crashlooping?")
    await asyncio.wait_for(parts.pipeline.handle(direct, parts.adapter), 60)
    assert "first token" in parts.out.getvalue()
