"""VllmEngine on the tiny test model: start, stream, abort, cached tokens, lanes, startup errors, death.

One engine serves the whole module (eager mode: starts in seconds, no compile).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from gpu_streams import chat_request, collect

from inference.admission import AdmissionConfig, AdmittedEngine
from inference.config import EngineConfig
from inference.engine import (
    ChatMessage,
    EngineDeadError,
    EngineStartupError,
    GenerationRequest,
    Lane,
    RequestAbortedError,
    TextDelta,
)
from inference.vllm_engine import VllmEngine

pytestmark = pytest.mark.asyncio(loop_scope="module")

SYSTEM = ChatMessage(
    "system",
    "You are opsbot, an SRE assistant. Answer from the cluster facts given; say what you do not know. " * 12,
)


def tiny_config(model: Path, **overrides: object) -> EngineConfig:
    base: dict[str, object] = {
        "model": str(model),
        "dtype": "bfloat16",
        "gpu_memory_utilization": 0.25,
        "max_model_len": 2048,
        "max_num_seqs": 16,
        "max_num_batched_tokens": 4096,
        "enforce_eager": True,
        "on_dead": "restart",
        "max_restarts": 1,
    }
    base.update(overrides)
    return EngineConfig(**base)  # type: ignore[arg-type]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(tiny_model: Path) -> AsyncIterator[VllmEngine]:
    fatal: list[str] = []
    eng = VllmEngine(tiny_config(tiny_model), on_fatal=fatal.append)
    await eng.start([SYSTEM])
    yield eng
    await eng.shutdown(drain_timeout_s=5)


def request(rid: str, question: str, *, lane: Lane = Lane.NORMAL, max_tokens: int = 16) -> GenerationRequest:
    return chat_request(rid, SYSTEM, question, lane=lane, max_tokens=max_tokens)


async def wait_until(predicate: object, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached before the deadline")
        await asyncio.sleep(0.05)


async def test_the_tiny_model_starts_streams_deltas_and_reports_counts(engine: VllmEngine) -> None:
    assert engine.health().ready
    assert engine.startup_s is not None and engine.startup_s > 0
    deltas, result = await collect(engine.generate(request("tiny-stream", "why is pod api-1 restarting?")))
    assert len(deltas) >= 2
    assert result.output_tokens == 16 and result.finish_reason == "length"
    assert result.text == "".join(d.text for d in deltas)
    assert result.prompt_tokens == len(
        engine.tokenizer.render([SYSTEM, ChatMessage("user", "why is pod api-1 restarting?")])
    )
    assert result.ttft_ms is not None and result.ttft_ms <= result.e2e_ms
    assert result.tpot_ms is not None and result.queue_ms >= 0


async def test_vllm_hands_text_over_every_stream_interval_tokens_not_every_token(engine: VllmEngine) -> None:
    # engine.stream_interval (8 by default): the first token at once, then 8 at a time, the last at once.
    interval = engine.config.stream_interval
    assert interval == 8
    deltas, result = await collect(engine.generate(request("tiny-interval", "list the pods", max_tokens=33)))
    assert result.output_tokens == 33
    assert 2 <= len(deltas) <= 1 + -(-32 // interval)  # never more hand-overs than the interval allows
    assert result.text == "".join(d.text for d in deltas)


async def test_the_system_prompt_is_served_from_the_prefix_cache_after_warm_up(engine: VllmEngine) -> None:
    system_tokens = len(engine.tokenizer.render([SYSTEM], add_generation_prompt=False))
    assert engine.warmup_prompt_tokens == system_tokens
    _, result = await collect(engine.generate(request("tiny-cache", "is the database healthy?")))
    block = engine.config.block_size
    # Only whole KV blocks are cached: everything but the system prompt's last partial block.
    assert result.cached_tokens >= (system_tokens // block) * block
    stats = engine.stats()
    assert stats.prefix_cache_hit_rate is not None and stats.prefix_cache_hit_rate > 0


async def test_closing_the_stream_early_aborts_the_request_in_vllm(engine: VllmEngine) -> None:
    stream = engine.generate(request("tiny-close", "list every pod", max_tokens=1500))
    async for event in stream:
        assert isinstance(event, TextDelta)
        break
    await stream.aclose()  # type: ignore[attr-defined]
    llm = engine._llm
    await wait_until(lambda: llm.output_processor.get_num_unfinished_requests() == 0)


async def test_abort_by_id_ends_the_stream_with_request_aborted(engine: VllmEngine) -> None:
    async def consume() -> None:
        await collect(engine.generate(request("tiny-abort", "explain everything", max_tokens=1500)))

    task = asyncio.create_task(consume())
    await wait_until(lambda: "tiny-abort" in engine._active)
    await engine.abort("tiny-abort")
    with pytest.raises(RequestAbortedError):
        await task


async def test_lanes_admit_urgent_work_past_queued_background_work(engine: VllmEngine) -> None:
    admitted = AdmittedEngine(engine, AdmissionConfig(max_in_flight={Lane.BACKGROUND: 2}))
    background = [
        asyncio.create_task(
            collect(
                admitted.generate(request(f"tiny-bg-{i}", "summarise", lane=Lane.BACKGROUND, max_tokens=64))
            )
        )
        for i in range(6)
    ]
    await wait_until(lambda: admitted.stats().waiting_by_lane["background"] > 0)
    _, urgent = await collect(
        admitted.generate(request("tiny-urgent", "alert!", lane=Lane.URGENT, max_tokens=8))
    )
    assert urgent.output_tokens == 8
    results = await asyncio.gather(*background)
    assert all(r.output_tokens == 64 for _, r in results)
    assert admitted.stats().waiting_by_lane == {"urgent": 0, "normal": 0, "background": 0}


async def test_startup_errors_name_the_cause_and_the_fix(
    engine: VllmEngine, tmp_path: Path, tiny_model: Path
) -> None:
    with pytest.raises(EngineStartupError, match="does not exist"):
        await VllmEngine(tiny_config(tmp_path / "missing")).start()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(EngineStartupError, match="no config.json"):
        await VllmEngine(tiny_config(empty)).start()
    no_tok = tmp_path / "no-tokenizer"
    no_tok.mkdir()
    shutil.copy(tiny_model / "config.json", no_tok / "config.json")
    with pytest.raises(EngineStartupError, match="no tokenizer"):
        await VllmEngine(tiny_config(no_tok)).start()
    alien = tmp_path / "alien"
    shutil.copytree(tiny_model, alien)
    config = json.loads((alien / "config.json").read_text())
    config["architectures"] = ["NoSuchModelForCausalLM"]
    (alien / "config.json").write_text(json.dumps(config))
    with pytest.raises(EngineStartupError, match="does not support the architecture"):
        await VllmEngine(tiny_config(alien)).start()
    # The module's engine holds GPU memory, so asking for nearly all of it must fail before vLLM starts.
    with pytest.raises(EngineStartupError, match="GiB free"):
        await VllmEngine(tiny_config(tiny_model, gpu_memory_utilization=0.99)).start()
    awq = tmp_path / "awq-override"
    shutil.copytree(tiny_model, awq)
    with pytest.raises(EngineStartupError, match="quantized offline"):
        await VllmEngine(tiny_config(awq, quantization="awq")).start()


async def test_a_dead_engine_fails_waiting_requests_flips_health_and_restarts(engine: VllmEngine) -> None:
    async def consume() -> None:
        await collect(engine.generate(request("tiny-dying", "keep talking", max_tokens=1500)))

    task = asyncio.create_task(consume())
    await wait_until(lambda: "tiny-dying" in engine._active)
    cores = [p for p in multiprocessing.active_children() if p.name.startswith("EngineCore")]
    assert cores, "no EngineCore child process found"
    for proc in cores:
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
    with pytest.raises(EngineDeadError):
        await task
    assert not engine.health().ready
    await wait_until(lambda: engine.health().ready, timeout_s=300)
    _, result = await collect(engine.generate(request("tiny-after-restart", "still there?")))
    assert result.output_tokens == 16


async def test_every_constrained_decision_of_a_random_model_parses(engine: VllmEngine) -> None:
    """A random model under the decision schema writes a whole call every time, never spaces until
    its budget runs out (vLLM's default whitespace freedom did exactly that on the H100 on
    2026-12-06: 0 of 48 decisions parsed). The budget is the schema's token ceiling, as the loop's."""
    from inference.engine import SamplingSettings, ToolSpec
    from inference.structured import token_ceiling
    from inference.tool_calls import decision_schema, final_answer_spec, parse_decision

    logs = ToolSpec(
        "kube_logs",
        "Log lines of a pod's container.",
        {
            "type": "object",
            "properties": {
                "namespace": {"type": "string", "enum": ["shop", "payments"]},
                "pod": {"type": "string", "minLength": 1, "maxLength": 40},
                "previous": {"type": "boolean"},
            },
            "required": ["namespace", "pod"],
            "additionalProperties": False,
        },
    )
    specs = (logs, final_answer_spec())
    schema = decision_schema(specs)
    parsed = 0
    for index in range(8):
        req = request(f"decision-{index}", f"why is api-{index} restarting?")
        budget = token_ceiling(schema) or 256
        req.sampling = SamplingSettings(
            temperature=0.0, top_p=1.0, max_tokens=budget, json_schema=json.dumps(schema)
        )
        _, result = await collect(engine.generate(req))
        call = parse_decision(result.text, specs)
        assert call.name in {"kube_logs", "final_answer"}, result.text
        parsed += 1
    assert parsed == 8
