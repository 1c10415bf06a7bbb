"""The engine contract, run for every in-process CPU engine: the transformers CPU engine on the tiny
offline model and the llama.cpp engine on SmolLM2-135M-Instruct (Q4_1 GGUF).

Streaming, results and timings, sampling settings, concurrency, lanes, aborts, timeouts, the
context window, the life cycle and the prompt cache (``cached_tokens``). Engine-specific checks
stay in ``test_cpu_engine.py`` and ``test_llamacpp_engine.py``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from engine_helpers import collect, wait_until
from engine_helpers import make_request as _make_request

from inference.admission import AdmittedEngine
from inference.config import EngineConfig
from inference.cpu_engine import CpuEngine
from inference.engine import (
    ChatMessage,
    ChatTokenizer,
    EngineDeadError,
    EngineGenerateError,
    GenerationRequest,
    Lane,
    RequestAbortedError,
    SamplingSettings,
    TextDelta,
)

SYSTEM = ChatMessage("system", "You are opsbot, an incident assistant for Kubernetes clusters.")
QUESTION = [SYSTEM, ChatMessage("user", "Why is checkout-api crashlooping?")]


def make_request(
    request_id: str, *, messages: list[ChatMessage] | None = None, **kw: object
) -> GenerationRequest:
    """:func:`engine_helpers.make_request` with this module's system prompt by default."""
    return _make_request(request_id, messages=messages or QUESTION, **kw)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Kind:
    """One engine under contract: how to build it on its model."""

    name: str
    model: Path
    prefix_cache: bool
    """Whether the engine keeps the shared system prompt's KV entries across requests."""

    def build(self, **overrides: object) -> CpuEngine:
        config = EngineConfig(model=str(self.model), cpu_threads=1, **overrides)  # type: ignore[arg-type]
        if self.name == "llamacpp":
            from inference.llamacpp_engine import LlamaCppEngine

            return LlamaCppEngine(config)
        return CpuEngine(config)


@pytest.fixture(scope="module", params=["cpu", "llamacpp"])
def kind(request: pytest.FixtureRequest) -> Kind:
    if request.param == "cpu":
        return Kind("cpu", request.getfixturevalue("tiny_model"), prefix_cache=False)
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip("llama-cpp-python is not installed (extra llamacpp)")
    return Kind("llamacpp", request.getfixturevalue("smollm2_gguf"), prefix_cache=True)


@pytest.fixture(scope="module")
def engine(kind: Kind) -> Iterator[CpuEngine]:
    """One started engine (4 workers / slots) shared by the tests that do not stop it."""
    eng = kind.build(cpu_max_concurrency=4)
    asyncio.run(eng.start([SYSTEM]))
    yield eng
    asyncio.run(eng.shutdown(drain_timeout_s=5))


def stopped_after(caplog: pytest.LogCaptureFixture, request_id: str) -> int:
    """Tokens the engine's own log line says it generated before it stopped ``request_id``."""
    for record in caplog.records:
        found = re.search(rf"request {re.escape(request_id)} stopped after (\d+) tokens", record.getMessage())
        if found:
            return int(found.group(1))
    raise AssertionError(f"no stop line for {request_id}")


# --- streaming and results -----------------------------------------------------------------------


async def test_stream_yields_several_deltas_then_a_result_whose_text_is_their_concatenation(
    engine: CpuEngine,
) -> None:
    deltas, result = await collect(engine.generate(make_request("stream-1", max_tokens=16)))
    assert len(deltas) >= 3
    assert result.text == "".join(deltas)
    assert result.request_id == "stream-1"
    assert result.finish_reason == "length"
    assert result.output_tokens == 16
    assert result.prompt_tokens == len(engine.tokenizer.render(QUESTION))
    assert 0 <= result.cached_tokens < result.prompt_tokens


async def test_timings_are_present_and_ordered(engine: CpuEngine) -> None:
    _, result = await collect(engine.generate(make_request("timings-1", max_tokens=8)))
    assert result.ttft_ms is not None and result.tpot_ms is not None
    assert 0 <= result.queue_ms <= result.ttft_ms <= result.e2e_ms
    assert result.tpot_ms > 0
    # The mean gap after the first token cannot exceed the time after the first token.
    assert result.tpot_ms * (result.output_tokens - 1) <= result.e2e_ms - result.ttft_ms + 1e-6


async def test_max_tokens_is_respected(engine: CpuEngine) -> None:
    _, result = await collect(engine.generate(make_request("max-1", max_tokens=3)))
    assert result.output_tokens == 3
    assert result.finish_reason == "length"
    _, free = await collect(engine.generate(make_request("max-2", max_tokens=3, ignore_eos=False)))
    assert free.output_tokens <= 3


async def test_a_seed_makes_the_output_deterministic(engine: CpuEngine) -> None:
    _, first = await collect(engine.generate(make_request("seed-1", seed=1234, max_tokens=20)))
    _, again = await collect(engine.generate(make_request("seed-2", seed=1234, max_tokens=20)))
    _, other = await collect(engine.generate(make_request("seed-3", seed=99, max_tokens=20)))
    assert first.text == again.text
    assert first.text != other.text


async def test_prompt_token_ids_are_accepted_as_they_are(engine: CpuEngine) -> None:
    ids = engine.tokenizer.render(QUESTION)
    request = GenerationRequest(
        "ids-1",
        "chat",
        Lane.NORMAL,
        SamplingSettings(max_tokens=4, seed=3, ignore_eos=True),
        prompt_token_ids=ids,
    )
    _, result = await collect(engine.generate(request))
    assert result.prompt_tokens == len(ids)
    assert result.output_tokens == 4


async def test_a_stop_string_ends_the_answer_before_it(engine: CpuEngine) -> None:
    _, plain = await collect(engine.generate(make_request("stop-1", temperature=0.0, max_tokens=24)))
    stop = plain.text[8:11]
    assert len(stop) == 3
    deltas, stopped = await collect(
        engine.generate(make_request("stop-2", temperature=0.0, max_tokens=24, stop=(stop,)))
    )
    assert stopped.text == plain.text[: plain.text.find(stop)] == "".join(deltas)
    assert stopped.finish_reason == "stop"
    assert stop not in "".join(deltas)


async def test_repetition_penalty_changes_greedy_output(engine: CpuEngine) -> None:
    _, plain = await collect(engine.generate(make_request("rep-1", temperature=0.0, max_tokens=24)))
    _, penalised = await collect(
        engine.generate(make_request("rep-2", temperature=0.0, max_tokens=24, repetition_penalty=3.0))
    )
    assert penalised.output_tokens == 24
    assert penalised.text != plain.text


async def test_a_prompt_longer_than_the_context_is_a_generate_error(engine: CpuEngine) -> None:
    long_question = [ChatMessage("user", "pod " * 5000)]
    with pytest.raises(EngineGenerateError, match="context window"):
        await collect(engine.generate(make_request("long-1", messages=long_question)))


async def test_a_duplicate_running_request_id_is_refused(engine: CpuEngine) -> None:
    first = engine.generate(make_request("dup-1", max_tokens=2000))
    await anext(first)
    with pytest.raises(EngineGenerateError, match="already running"):
        await anext(engine.generate(make_request("dup-1")))
    await first.aclose()  # type: ignore[attr-defined]


# --- the prompt cache ----------------------------------------------------------------------------


async def test_the_shared_system_prompt_is_served_from_the_prefix_cache_where_the_engine_keeps_one(
    engine: CpuEngine, kind: Kind
) -> None:
    system_only = len(engine.tokenizer.render([SYSTEM], add_generation_prompt=False))
    asks = [
        QUESTION[:1] + [ChatMessage("user", q)] for q in ("Is the payments queue backed up?", "Why 503s?")
    ]
    results = [
        (await collect(engine.generate(make_request(f"cache-{i}", messages=m))))[1]
        for i, m in enumerate(asks)
    ]
    _, repeat = await collect(engine.generate(make_request("cache-again", messages=asks[1])))
    stats = engine.stats()
    if not kind.prefix_cache:
        assert all(r.cached_tokens == 0 for r in (*results, repeat))
        assert stats.prefix_cache_hit_rate is None
        return
    # The system prompt was warmed at start: every request finds at least its tokens cached...
    for result in results:
        assert system_only <= result.cached_tokens < result.prompt_tokens
    # ...and the very same prompt again is cached whole but for the token sampled from.
    assert repeat.cached_tokens >= repeat.prompt_tokens - 1
    assert stats.prefix_cache_hit_rate is not None and 0 < stats.prefix_cache_hit_rate <= 1


# --- concurrency ---------------------------------------------------------------------------------


async def test_four_concurrent_requests_all_progress_before_any_finishes(engine: CpuEngine) -> None:
    events: list[tuple[str, str]] = []

    async def consume(name: str) -> None:
        async for event in engine.generate(make_request(name, max_tokens=100, seed=len(events))):
            kind = "delta" if isinstance(event, TextDelta) else "result"
            if kind == "result" or not any(e == (name, "delta") for e in events):
                events.append((name, kind))

    names = [f"conc-{i}" for i in range(4)]
    await asyncio.gather(*(consume(n) for n in names))
    first_result = next(i for i, (_, kind) in enumerate(events) if kind == "result")
    assert sorted(name for name, kind in events[:first_result]) == names
    assert all(kind == "delta" for _, kind in events[:first_result])


async def test_the_event_loop_stays_responsive_while_requests_decode(engine: CpuEngine) -> None:
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0)

    tick_task = asyncio.create_task(ticker())
    results = await asyncio.gather(
        *(collect(engine.generate(make_request(f"loop-{i}", max_tokens=40))) for i in range(2))
    )
    done.set()
    await tick_task
    # Every delivered delta is one loop wake-up; a blocked loop would tick only a handful of times.
    assert ticks > sum(len(deltas) for deltas, _ in results)


async def test_stats_count_running_and_waiting_by_lane_and_urgent_jumps_the_queue(kind: Kind) -> None:
    engine = kind.build(cpu_max_concurrency=1)
    await engine.start()
    try:
        blocker = engine.generate(make_request("blocker", max_tokens=2000))
        await anext(blocker)
        order: list[str] = []

        async def consume(request: GenerationRequest) -> None:
            async for _ in engine.generate(request):
                order.append(request.request_id)
                return

        normal = asyncio.create_task(consume(make_request("normal-1", max_tokens=2)))
        await wait_until(lambda: engine.stats().waiting == 1)
        urgent = asyncio.create_task(consume(make_request("urgent-1", lane=Lane.URGENT, max_tokens=2)))
        await wait_until(lambda: engine.stats().waiting == 2)
        stats = engine.stats()
        assert stats.backend == kind.name and stats.model == str(kind.model)
        assert (stats.running, stats.running_by_lane) == (1, {"normal": 1})
        assert stats.waiting_by_lane == {"normal": 1, "urgent": 1}
        await engine.abort("blocker")
        with pytest.raises(RequestAbortedError):
            await anext(blocker)
        await asyncio.gather(normal, urgent)
        assert order == ["urgent-1", "normal-1"]
    finally:
        await engine.shutdown(drain_timeout_s=5)


# --- aborts --------------------------------------------------------------------------------------


async def test_abort_mid_stream_raises_request_aborted_and_stops_decoding(
    engine: CpuEngine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="inference")
    stream = engine.generate(make_request("abort-1", max_tokens=2000))
    assert isinstance(await anext(stream), TextDelta)
    await engine.abort("abort-1")
    with pytest.raises(RequestAbortedError, match="abort-1"):
        while True:
            await anext(stream)
    await wait_until(lambda: "abort-1 stopped" in caplog.text)
    await wait_until(lambda: engine.stats().running == 0)
    assert stopped_after(caplog, "abort-1") < 2000
    await engine.abort("abort-1")  # a finished id is a no-op
    await engine.abort("never-seen")


async def test_closing_the_iterator_aborts_the_request(
    engine: CpuEngine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="inference")
    stream = engine.generate(make_request("close-1", max_tokens=2000))
    await anext(stream)
    await stream.aclose()  # type: ignore[attr-defined]
    with pytest.raises(StopAsyncIteration):
        await anext(stream)
    await wait_until(lambda: "close-1 stopped" in caplog.text)
    assert stopped_after(caplog, "close-1") < 2000
    assert "closed by its reader" in caplog.text


async def test_breaking_out_of_the_loop_aborts_the_request(
    engine: CpuEngine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="inference")
    async for _ in engine.generate(make_request("break-1", max_tokens=2000)):
        break
    gc.collect()
    await wait_until(lambda: "break-1 stopped" in caplog.text)
    assert stopped_after(caplog, "break-1") < 2000


async def test_cancelling_the_reading_task_aborts_the_request(
    engine: CpuEngine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="inference")
    got_first = asyncio.Event()

    async def reader() -> None:
        async for _ in engine.generate(make_request("cancel-1", max_tokens=2000)):
            got_first.set()

    task = asyncio.create_task(reader())
    await got_first.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_until(lambda: "cancel-1 stopped" in caplog.text)
    assert stopped_after(caplog, "cancel-1") < 2000


async def test_a_request_past_its_timeout_is_aborted(kind: Kind) -> None:
    # The deadline is enforced in one layer for every backend: the admission front.
    engine = AdmittedEngine(kind.build(), request_timeout_s=0.001)
    await engine.start()
    try:
        with pytest.raises(RequestAbortedError, match="timed out"):
            await collect(engine.generate(make_request("slow-1", max_tokens=2000)))
    finally:
        await engine.shutdown(drain_timeout_s=5)


async def test_the_answer_is_cut_at_the_configured_context_window(kind: Kind) -> None:
    engine = kind.build(max_model_len=60, cpu_max_concurrency=1)
    await engine.start()
    try:
        short = [ChatMessage("user", "Why is checkout-api crashlooping?")]
        _, result = await collect(engine.generate(make_request("window-1", messages=short, max_tokens=100)))
        assert result.prompt_tokens + result.output_tokens == 60
        assert result.finish_reason == "length"
    finally:
        await engine.shutdown(drain_timeout_s=5)


# --- life cycle ----------------------------------------------------------------------------------


async def test_health_follows_the_life_cycle_and_shutdown_drains_in_flight_requests(kind: Kind) -> None:
    engine = kind.build(cpu_max_concurrency=1)
    assert not engine.health().ready and "not started" in engine.health().reason
    with pytest.raises(EngineDeadError):
        await anext(engine.generate(make_request("early-1")))
    with pytest.raises(EngineDeadError):
        _ = engine.tokenizer
    await engine.start()
    assert engine.health().ready
    assert isinstance(engine.tokenizer, ChatTokenizer)

    stream = engine.generate(make_request("drain-1", max_tokens=60))
    first = await anext(stream)
    assert isinstance(first, TextDelta)
    stopping = asyncio.create_task(engine.shutdown(drain_timeout_s=60))
    await wait_until(lambda: not engine.health().ready)
    assert "shutting down" in engine.health().reason
    with pytest.raises(RequestAbortedError, match="shutting down"):
        await anext(engine.generate(make_request("late-1")))
    deltas, result = await collect(stream)
    assert result.output_tokens == 60
    assert result.text == first.text + "".join(deltas)
    await stopping
    assert not engine.health().ready and "shut down" in engine.health().reason
    await engine.shutdown()  # twice is harmless


async def test_shutdown_aborts_what_outlives_the_drain_deadline(kind: Kind) -> None:
    engine = kind.build(cpu_max_concurrency=1)
    await engine.start()
    running = engine.generate(make_request("outlive-1", max_tokens=2000))
    await anext(running)
    waiting = engine.generate(make_request("outlive-2", max_tokens=2000))
    waiting_next = asyncio.create_task(anext(waiting))
    await wait_until(lambda: engine.stats().waiting == 1)
    await engine.shutdown(drain_timeout_s=0)
    with pytest.raises(RequestAbortedError, match="shut down"):
        while True:
            await anext(running)
    with pytest.raises(RequestAbortedError, match="shut down"):
        await waiting_next
    assert engine.stats().running == engine.stats().waiting == 0
