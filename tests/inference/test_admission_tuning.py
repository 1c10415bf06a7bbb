"""The admission controller's runtime tuning API (what the SLO guard calls): limits and max_tokens
caps change on the live controller, never abort admitted work, and reach a real CPU engine."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from inference.admission import AdmissionConfig, AdmissionController, AdmittedEngine, Ticket
from inference.config import EngineConfig
from inference.cpu_engine import CpuEngine
from inference.engine import ChatMessage, GenerationRequest, GenerationResult, Lane, SamplingSettings

B = Lane.BACKGROUND


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_lowering_a_limit_keeps_admitted_requests_and_holds_new_ones_until_below_it() -> None:
    ctl = AdmissionController(AdmissionConfig(max_in_flight={B: 4}, max_prefilling={}))
    assert ctl.limit(B) == 4 and ctl.configured_limit(B) == 4
    held = [await ctl.acquire(B, f"r{i}") for i in range(3)]
    ctl.set_limit(B, 1)
    assert ctl.in_flight["background"] == 3  # nothing admitted is taken back
    waiting = asyncio.create_task(ctl.acquire(B, "late"))
    await settle()
    assert not waiting.done()
    held[0].release()
    held[1].release()
    await settle()
    assert not waiting.done()  # 1 in flight is the new limit
    held[2].release()
    await settle()
    assert waiting.done()
    (await waiting).release()
    assert ctl.configured_limit(B) == 4 and ctl.limit(B) == 1


async def test_raising_a_limit_admits_the_waiting_requests_at_once() -> None:
    ctl = AdmissionController(AdmissionConfig(max_in_flight={B: 1}, max_prefilling={}))
    first = await ctl.acquire(B, "first")
    waiting = [asyncio.create_task(ctl.acquire(B, f"w{i}")) for i in range(2)]
    await settle()
    assert ctl.queue_depths["background"] == 2
    ctl.set_limit(B, None)
    await settle()
    assert all(t.done() for t in waiting) and ctl.in_flight["background"] == 3
    tickets: list[Ticket] = [first, *[await t for t in waiting]]
    for ticket in tickets:
        ticket.release()


def test_limits_and_caps_below_one_are_refused() -> None:
    ctl = AdmissionController()
    with pytest.raises(ValueError, match="at least 1"):
        ctl.set_limit(B, 0)
    with pytest.raises(ValueError, match="at least 1"):
        ctl.set_max_tokens_cap(B, 0)


@pytest.mark.timeout(120)
async def test_a_max_tokens_cap_shortens_new_answers_of_its_lane_only_on_the_real_cpu_engine(
    tiny_model: Path,
) -> None:
    inner = CpuEngine(EngineConfig(model=str(tiny_model), max_model_len=512, cpu_threads=1))
    engine = AdmittedEngine(inner, AdmissionConfig())
    await engine.start()
    try:

        async def answer(lane: Lane, rid: str) -> GenerationResult:
            request = GenerationRequest(
                request_id=rid,
                scenario="chat",
                lane=lane,
                sampling=SamplingSettings(max_tokens=12, ignore_eos=True, seed=1),
                messages=[ChatMessage("user", "why is the pod crashlooping?")],
            )
            results = [e async for e in engine.generate(request) if isinstance(e, GenerationResult)]
            return results[-1]

        assert (await answer(B, "before")).output_tokens == 12
        engine.controller.set_max_tokens_cap(B, 4)
        assert (await answer(B, "capped")).output_tokens == 4
        assert (await answer(Lane.URGENT, "urgent")).output_tokens == 12
        engine.controller.set_max_tokens_cap(B, None)
        assert (await answer(B, "after")).output_tokens == 12
    finally:
        await engine.shutdown(5)
