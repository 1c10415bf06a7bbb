"""VllmEngine on an 8B-class model (Llama-3-8B shapes, dummy weights): bf16 and online FP8.

The engine configuration matches ``bench/engine_bench.py``'s, so these tests also fill the
compile cache the benchmark then starts from.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from gpu_streams import chat_request, collect

from inference.admission import AdmittedEngine
from inference.config import EngineConfig
from inference.engine import (
    ChatMessage,
    GenerationRequest,
    Lane,
)
from inference.vllm_engine import VllmEngine

pytestmark = pytest.mark.asyncio(loop_scope="module")

SYSTEM = ChatMessage(
    "system",
    "You are opsbot, an SRE assistant for incident response. Use only the facts in the context; "
    "quote exact numbers; say what is missing. " * 40,
)


def config_8b(model: Path, **overrides: object) -> EngineConfig:
    base: dict[str, object] = {
        "model": str(model),
        "load_format": "dummy",
        "dtype": "bfloat16",
        "gpu_memory_utilization": 0.85,
        "max_model_len": 4096,
        "max_num_seqs": 64,
        "max_num_batched_tokens": 8192,
        "scheduling_policy": "priority",
    }
    base.update(overrides)
    return EngineConfig(**base)  # type: ignore[arg-type]


def request(rid: str, question: str, *, lane: Lane = Lane.NORMAL, max_tokens: int = 32) -> GenerationRequest:
    return chat_request(rid, SYSTEM, question, lane=lane, max_tokens=max_tokens)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine_bf16(model_8b: Path) -> AsyncIterator[VllmEngine]:
    eng = VllmEngine(config_8b(model_8b))
    await eng.start([SYSTEM])
    yield eng
    await eng.shutdown(drain_timeout_s=5)


async def test_8b_dummy_model_starts_logs_its_startup_time_and_streams(engine_bf16: VllmEngine) -> None:
    assert engine_bf16.health().ready
    assert engine_bf16.startup_s is not None
    quant = engine_bf16.quantization
    assert quant is not None and quant.method is None and quant.bits == 16
    deltas, result = await collect(engine_bf16.generate(request("8b-stream", "why is checkout slow?")))
    assert result.output_tokens == 32 and len(deltas) >= 2


async def test_8b_burst_serves_at_least_95_percent_of_the_system_prompt_from_cache(
    engine_bf16: VllmEngine,
) -> None:
    system_tokens = len(engine_bf16.tokenizer.render([SYSTEM], add_generation_prompt=False))
    assert system_tokens > 500
    results = await asyncio.gather(
        *[
            collect(engine_bf16.generate(request(f"8b-burst-{i}", f"question {i}: what changed?")))
            for i in range(8)
        ]
    )
    for _, result in results:
        assert min(result.cached_tokens, system_tokens) / system_tokens >= 0.95
    stats = engine_bf16.stats()
    assert stats.kv_cache_usage is not None and stats.prefix_cache_hit_rate is not None


async def test_8b_urgent_request_completes_under_background_load(engine_bf16: VllmEngine) -> None:
    admitted = AdmittedEngine(engine_bf16)
    background = [
        asyncio.create_task(
            collect(
                admitted.generate(
                    request(f"8b-bg-{i}", "summarise the week", lane=Lane.BACKGROUND, max_tokens=200)
                )
            )
        )
        for i in range(32)
    ]
    await asyncio.sleep(0)
    _, urgent = await collect(
        admitted.generate(request("8b-urgent", "pager: api down", lane=Lane.URGENT, max_tokens=16))
    )
    assert urgent.output_tokens == 16 and urgent.ttft_ms is not None
    results = await asyncio.gather(*background)
    assert all(r.output_tokens == 200 for _, r in results)
    # Timing targets are measured by bench/engine_bench.py, not asserted here.


async def test_8b_online_fp8_quantization_starts_and_generates(
    engine_bf16: VllmEngine, model_8b: Path
) -> None:
    await engine_bf16.shutdown(drain_timeout_s=5)  # free the GPU for the FP8 engine
    eng = VllmEngine(config_8b(model_8b, quantization="fp8"))
    await eng.start([SYSTEM])
    try:
        assert eng.quantization is not None and eng.quantization.online and eng.quantization.method == "fp8"
        assert "fp8" in (eng.stats().quantization or "")
        _, result = await collect(eng.generate(request("fp8-1", "what is the p99?")))
        assert result.output_tokens == 32
        system_tokens = len(eng.tokenizer.render([SYSTEM], add_generation_prompt=False))
        assert min(result.cached_tokens, system_tokens) / system_tokens >= 0.95
    finally:
        await eng.shutdown(drain_timeout_s=5)
