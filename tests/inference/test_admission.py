"""Admission control: lane ordering, caps, prefill pacing, timeouts and queue depth (CPU only)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence

import pytest

from inference.admission import AdmissionConfig, AdmissionController, AdmittedEngine, Ticket
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
    SamplingSettings,
    TextDelta,
)

U, N, B = Lane.URGENT, Lane.NORMAL, Lane.BACKGROUND


def config(**kwargs: object) -> AdmissionConfig:
    base: dict[str, object] = {
        "max_in_flight": {},
        "max_prefilling": {},
        "max_prefill_tokens": {},
        "hold_background_while_urgent_prefills": False,
        "queue_timeout_s": 30.0,
    }
    base.update(kwargs)
    return AdmissionConfig(**base)  # type: ignore[arg-type]


async def settle() -> None:
    # Granting resolves futures; let the woken acquire() calls run.
    for _ in range(5):
        await asyncio.sleep(0)


def start(ctl: AdmissionController, lane: Lane, rid: str) -> asyncio.Task[Ticket]:
    return asyncio.create_task(ctl.acquire(lane, rid), name=rid)


async def test_a_lane_at_its_in_flight_limit_queues_fifo_and_admits_on_release() -> None:
    ctl = AdmissionController(config(max_in_flight={B: 1}))
    first = await ctl.acquire(B, "a")
    second, third = start(ctl, B, "b"), start(ctl, B, "c")
    await settle()
    assert ctl.queue_depths["background"] == 2 and not second.done()
    first.release()
    await settle()
    assert second.done() and not third.done()
    assert ctl.in_flight["background"] == 1 and ctl.queue_depths["background"] == 1
    (await second).release()
    (await third).release()
    assert ctl.in_flight == {"urgent": 0, "normal": 0, "background": 0}


async def test_background_waits_while_an_urgent_request_has_no_first_token_yet() -> None:
    ctl = AdmissionController(config(hold_background_while_urgent_prefills=True))
    urgent = await ctl.acquire(U, "u")
    background = start(ctl, B, "b")
    normal = await ctl.acquire(N, "n")  # other lanes are not held
    await settle()
    assert not background.done()
    urgent.first_token()
    await settle()
    assert background.done()
    for ticket in (urgent, normal, await background):
        ticket.release()


async def test_background_prefills_are_paced_by_first_tokens() -> None:
    ctl = AdmissionController(config(max_prefilling={B: 2}))
    a, b = await ctl.acquire(B, "a"), await ctl.acquire(B, "b")
    c = start(ctl, B, "c")
    await settle()
    assert not c.done() and ctl.prefilling["background"] == 2
    a.first_token()
    await settle()
    assert c.done() and ctl.in_flight["background"] == 3
    a.first_token()  # a second call is a no-op
    assert ctl.prefilling["background"] == 2
    for ticket in (a, b, await c):
        ticket.release()
    assert ctl.prefilling["background"] == 0


async def test_prefills_are_paced_by_their_new_tokens_and_a_large_prompt_goes_in_alone() -> None:
    ctl = AdmissionController(config(max_prefill_tokens={N: 100}))
    small = [await ctl.acquire(N, f"s{i}", 30) for i in range(3)]  # 90 new tokens: all at once
    fourth = asyncio.create_task(ctl.acquire(N, "s3", 30))
    await settle()
    assert not fourth.done() and ctl.prefilling["normal"] == 3
    small[0].first_token()  # 60 left in prefill: the fourth fits
    await settle()
    assert fourth.done()
    for ticket in (*small, await fourth):
        ticket.release()
    big = await ctl.acquire(N, "big", 500)  # larger than the budget, nothing else in prefill
    after = asyncio.create_task(ctl.acquire(N, "after", 1))
    await settle()
    assert not after.done()
    big.release()  # ends before its first token (aborted): its tokens are given back too
    await settle()
    assert after.done()
    (await after).release()
    assert ctl.prefilling["normal"] == 0


async def test_the_new_tokens_of_a_prompt_are_those_after_the_prefix_shared_with_the_last_one() -> None:
    inner = ScriptedEngine()
    engine = AdmittedEngine(inner, config(max_prefill_tokens={N: 60}))
    system = list(range(1000, 1040))  # a 40-token system prompt: 32 of them in whole KV blocks
    first = GenerationRequest("q1", "chat", N, SamplingSettings(), prompt_token_ids=system + [1] * 50)
    second = GenerationRequest("q2", "chat", N, SamplingSettings(), prompt_token_ids=system + [2] * 20)
    third = GenerationRequest("q3", "chat", N, SamplingSettings(), prompt_token_ids=system + [3] * 20)
    tasks = [asyncio.create_task(collect(engine, r)) for r in (first, second)]
    await settle()
    # q1 (nothing known yet: all 90 new) goes in alone; q2 waits for q1's first token
    assert "q1" in inner.gates and "q2" not in inner.gates
    inner.gates["q1"].put_nowait("x")
    await settle()
    assert "q2" in inner.gates  # 60 - 32 = 28 new tokens
    tasks.append(asyncio.create_task(collect(engine, third)))
    await settle()
    assert "q3" in inner.gates  # 28 + 28 within the budget of 60: both prefill together
    for rid in ("q1", "q2", "q3"):
        inner.gates[rid].put_nowait(None)
    await asyncio.gather(*tasks)


async def test_background_in_flight_is_capped_while_urgent_work_runs() -> None:
    ctl = AdmissionController(config(background_max_in_flight_when_urgent=1))
    bg1 = await ctl.acquire(B, "b1")
    urgent = await ctl.acquire(U, "u")
    urgent.first_token()
    bg2 = start(ctl, B, "b2")
    await settle()
    assert not bg2.done()
    urgent.release()
    await settle()
    assert bg2.done()
    bg1.release()
    (await bg2).release()


async def test_a_full_lane_queue_is_refused_at_once_with_overloaded() -> None:
    ctl = AdmissionController(config(max_in_flight={N: 1}, max_queue={N: 1}))
    held = await ctl.acquire(N, "a")
    queued = start(ctl, N, "b")
    await settle()
    with pytest.raises(EngineOverloadedError, match="normal lane is full"):
        await ctl.acquire(N, "c")
    held.release()
    (await queued).release()


async def test_a_wait_past_the_queue_timeout_is_overloaded_and_leaves_the_queue() -> None:
    ctl = AdmissionController(config(max_in_flight={U: 1}, queue_timeout_s=0.05))
    held = await ctl.acquire(U, "a")
    with pytest.raises(EngineOverloadedError, match="waited"):
        await ctl.acquire(U, "b")
    assert ctl.queue_depths["urgent"] == 0
    held.release()
    assert ctl.in_flight["urgent"] == 0


async def test_a_cancelled_waiter_leaves_the_queue_without_taking_a_slot() -> None:
    ctl = AdmissionController(config(max_in_flight={N: 1}))
    held = await ctl.acquire(N, "a")
    waiter = start(ctl, N, "b")
    await settle()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert ctl.queue_depths["normal"] == 0
    held.release()
    assert ctl.in_flight["normal"] == 0


async def test_queue_depth_changes_reach_the_listener() -> None:
    seen: list[tuple[dict[str, int], dict[str, int]]] = []

    def listener(queued: Mapping[Lane, int], in_flight: Mapping[Lane, int]) -> None:
        seen.append(({k.value: v for k, v in queued.items()}, {k.value: v for k, v in in_flight.items()}))

    ctl = AdmissionController(config(max_in_flight={B: 1}), on_change=listener)
    held = await ctl.acquire(B, "a")
    waiter = start(ctl, B, "b")
    await settle()
    assert seen[-1][0]["background"] == 1 and seen[-1][1]["background"] == 1
    held.release()
    (await waiter).release()
    assert seen[-1][0]["background"] == 0 and seen[-1][1]["background"] == 0


async def test_close_fails_queued_requests_and_refuses_new_ones() -> None:
    ctl = AdmissionController(config(max_in_flight={N: 1}))
    held = await ctl.acquire(N, "a")
    waiter = start(ctl, N, "b")
    await settle()
    ctl.close("shutting down")
    with pytest.raises(RequestAbortedError, match="shutting down"):
        await waiter
    with pytest.raises(RequestAbortedError):
        await ctl.acquire(U, "c")
    held.release()


def test_limits_below_one_are_rejected() -> None:
    with pytest.raises(ValueError, match="max_prefilling"):
        AdmissionConfig(max_prefilling={B: 0})


class ScriptedEngine(Engine):
    """An engine whose requests produce tokens only when the test says so."""

    backend = "scripted"

    def __init__(self) -> None:
        self.gates: dict[str, asyncio.Queue[str | None]] = {}
        self.aborted: list[str] = []
        self.started = asyncio.Event()

    async def start(self, warmup_messages: Sequence[ChatMessage] = ()) -> None:
        self.started.set()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        gate = self.gates.setdefault(request.request_id, asyncio.Queue())
        text = ""
        while (piece := await gate.get()) is not None:
            text += piece
            yield TextDelta(piece)
        yield GenerationResult(request.request_id, text, "stop", 3, 0, len(text), 1.0, 2.0, 1.0, 5.0)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def health(self) -> EngineHealth:
        return EngineHealth(True)

    def stats(self) -> EngineStats:
        return EngineStats(backend=self.backend, model="scripted")

    async def shutdown(self, drain_timeout_s: float = 30.0) -> None:
        return None

    @property
    def tokenizer(self) -> ChatTokenizer:
        raise NotImplementedError


def request(rid: str, lane: Lane) -> GenerationRequest:
    return GenerationRequest(rid, "chat", lane, SamplingSettings(), prompt_token_ids=[1, 2, 3])


async def collect(engine: Engine, req: GenerationRequest) -> list[GenerationEvent]:
    return [event async for event in engine.generate(req)]


async def test_admitted_engine_paces_background_by_first_token_and_adds_the_wait_to_timings() -> None:
    inner = ScriptedEngine()
    engine = AdmittedEngine(inner, config(max_prefilling={B: 1}))
    await engine.start()
    first = asyncio.create_task(collect(engine, request("b1", B)))
    second = asyncio.create_task(collect(engine, request("b2", B)))
    await settle()
    assert "b2" not in inner.gates and engine.stats().waiting_by_lane["background"] == 1
    inner.gates["b1"].put_nowait("x")  # b1's first token frees the prefill slot
    await settle()
    assert "b2" in inner.gates
    assert engine.stats().running_by_lane["background"] == 2
    for rid in ("b1", "b2"):
        inner.gates[rid].put_nowait(None)
    events = await second
    result = events[-1]
    assert isinstance(result, GenerationResult)
    assert result.e2e_ms >= 5.0 and result.queue_ms >= 1.0
    await first
    assert engine.stats().running_by_lane["background"] == 0


async def test_aborting_a_queued_request_ends_its_stream_with_request_aborted() -> None:
    inner = ScriptedEngine()
    engine = AdmittedEngine(inner, config(max_in_flight={N: 1}))
    running = asyncio.create_task(collect(engine, request("n1", N)))
    queued = asyncio.create_task(collect(engine, request("n2", N)))
    await settle()
    await engine.abort("n2")
    with pytest.raises(RequestAbortedError):
        await queued
    await engine.abort("n1")  # admitted: passed on to the inner engine
    assert inner.aborted == ["n1"]
    inner.gates["n1"].put_nowait(None)
    await running


async def test_closing_the_stream_early_releases_the_slot() -> None:
    inner = ScriptedEngine()
    engine = AdmittedEngine(inner, config(max_in_flight={U: 1}))
    stream = engine.generate(request("u1", U))
    task = asyncio.create_task(anext(stream))  # type: ignore[arg-type]
    await settle()
    inner.gates["u1"].put_nowait("a")
    assert await task == TextDelta("a")
    await stream.aclose()  # type: ignore[attr-defined]
    assert engine.stats().running_by_lane["urgent"] == 0


async def test_above_the_kv_watermark_background_waits_and_urgent_work_still_goes_in() -> None:
    usage = [0.95]
    ctl = AdmissionController(config(background_kv_watermark=0.9), kv_usage=lambda: usage[0])
    urgent = await ctl.acquire(U, "u1")  # urgent work never waits for KV headroom
    background = asyncio.create_task(ctl.acquire(B, "b1"))
    await settle()
    assert not background.done() and ctl.queue_depths["background"] == 1
    usage[0] = 0.5  # KV pages freed: the queue is looked at again without any other event
    ticket = await asyncio.wait_for(background, 2.0)
    assert ticket.lane is B
    urgent.release()
    ticket.release()
    ctl.close()


async def test_without_a_kv_reading_the_watermark_never_blocks() -> None:
    ctl = AdmissionController(config(background_kv_watermark=0.1), kv_usage=lambda: None)
    ticket = await asyncio.wait_for(ctl.acquire(B, "b1"), 1.0)
    ticket.release()


class ComputingEngine(ScriptedEngine):
    """A scripted engine that also says when it last computed (llama.cpp evaluating a long prompt)."""

    def __init__(self) -> None:
        super().__init__()
        self.computed: float | None = None
        self.declared: list[str] = []

    def computing_at(self) -> float | None:
        return self.computed

    def declare_dead(self, reason: str) -> bool:
        self.declared.append(reason)
        return True


async def test_the_watchdog_waits_while_the_engine_computes_without_tokens_and_fires_once_it_stops() -> None:
    """A prompt evaluation starved of CPU gives no token for longer than ``stall_timeout_s`` but is
    no hang while the engine shows it is computing; once that stops too, the stream fails as hung."""
    stall = 0.2
    inner = ComputingEngine()
    engine = AdmittedEngine(inner, config(), stall_timeout_s=stall)
    answer = asyncio.create_task(collect(engine, request("slow", N)))
    computing_until = time.monotonic() + 4 * stall
    while time.monotonic() < computing_until:  # computing, no token, for 4 stall periods
        inner.computed = time.monotonic()
        await asyncio.sleep(stall / 10)
    assert not answer.done() and engine.stalls == 0 and inner.declared == []
    stopped = time.monotonic()
    with pytest.raises(EngineDeadError, match=r"hung \(no token for"):
        await answer
    assert stall * 0.9 <= time.monotonic() - stopped <= stall * 3
    assert engine.stalls == 1 and len(inner.declared) == 1


async def test_an_engine_that_shows_no_computing_is_hung_after_stall_timeout_s_without_a_token() -> None:
    stall = 0.2
    inner = ScriptedEngine()  # computing_at() is None: only tokens count
    engine = AdmittedEngine(inner, config(), stall_timeout_s=stall)
    started = time.monotonic()
    with pytest.raises(EngineDeadError):
        await collect(engine, request("silent", N))
    assert stall * 0.9 <= time.monotonic() - started <= stall * 3 and engine.stalls == 1
