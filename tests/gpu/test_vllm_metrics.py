"""/metrics and the SLO guard's levers on the vLLM engine (tiny test model, eager mode): engine
gauges from vLLM's own stats, vLLM's ``vllm:*`` series beside opsbot's, and a background
``max_tokens`` cap applied by the admission layer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from gpu_streams import chat_request, collect
from prometheus_client import REGISTRY, generate_latest

from bot.config import SloSettings
from bot.http import refresh_engine_metrics
from bot.slo import SloGuard
from inference.admission import AdmissionConfig, AdmittedEngine
from inference.config import EngineConfig
from inference.engine import ChatMessage, Lane
from inference.vllm_engine import VllmEngine

pytestmark = pytest.mark.asyncio(loop_scope="module")

SYSTEM = ChatMessage("system", "You are opsbot, an SRE assistant. Answer from the cluster facts given. " * 12)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(tiny_model: Path) -> AsyncIterator[AdmittedEngine]:
    config = EngineConfig(
        model=str(tiny_model),
        dtype="bfloat16",
        gpu_memory_utilization=0.25,
        max_model_len=2048,
        max_num_seqs=16,
        enforce_eager=True,
    )
    eng = AdmittedEngine(VllmEngine(config), AdmissionConfig(), request_timeout_s=120)
    await eng.start([SYSTEM])
    yield eng
    await eng.shutdown(drain_timeout_s=5)


async def test_metrics_carry_vllm_engine_gauges_and_vllm_own_series(engine: AdmittedEngine) -> None:
    for i in range(4):
        await collect(
            engine.generate(chat_request(f"m{i}", SYSTEM, f"why is pod api-{i} restarting?", max_tokens=8))
        )
    refresh_engine_metrics(engine)
    assert REGISTRY.get_sample_value("opsbot_engine_ready", {"engine": "default"}) == 1
    kv = REGISTRY.get_sample_value("opsbot_engine_kv_cache_usage_ratio", {"engine": "default"})
    assert kv is not None and 0.0 <= kv <= 1.0
    hit = REGISTRY.get_sample_value("opsbot_engine_prefix_cache_hit_ratio", {"engine": "default"})
    assert hit is not None and hit > 0  # the shared system prompt comes from the prefix cache
    assert REGISTRY.get_sample_value("opsbot_engine_preemptions_total", {"engine": "default"}) is not None
    assert REGISTRY.get_sample_value("opsbot_admission_max_in_flight", {"lane": "background"}) == 56
    assert b"\nvllm:" in generate_latest(REGISTRY)


async def test_the_guard_reads_kv_use_from_vllm_and_a_background_cap_shortens_answers(
    engine: AdmittedEngine,
) -> None:
    guard = SloGuard.for_engine(SloSettings(), engine)
    assert guard is not None and guard.kv_usage is not None
    usage = guard.kv_usage()
    assert usage is not None and 0.0 <= usage <= 1.0
    engine.controller.set_max_tokens_cap(Lane.BACKGROUND, 5)
    try:
        _, capped = await collect(
            engine.generate(
                chat_request("capped", SYSTEM, "and the memory?", lane=Lane.BACKGROUND, max_tokens=32)
            )
        )
        _, urgent = await collect(
            engine.generate(
                chat_request("urgent", SYSTEM, "and the memory?", lane=Lane.URGENT, max_tokens=32)
            )
        )
    finally:
        engine.controller.set_max_tokens_cap(Lane.BACKGROUND, None)
    assert capped.output_tokens == 5 and urgent.output_tokens == 32
