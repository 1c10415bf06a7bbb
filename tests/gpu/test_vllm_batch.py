"""The offline batch engine (vLLM's ``LLM``, static batching) on the tiny test model, and
``opsbot analyze`` on vLLM end to end. One engine serves the module (eager mode: starts in seconds)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from inference.config import EngineConfig
from inference.engine import ChatMessage, GenerationRequest, GenerationResult, Lane, SamplingSettings
from inference.vllm_batch import OfflineBatchEngine

REPO = Path(__file__).resolve().parents[2]


def config(model: Path) -> EngineConfig:
    return EngineConfig(
        backend="vllm",
        model=str(model),
        dtype="bfloat16",
        gpu_memory_utilization=0.25,
        max_model_len=2048,
        max_num_batched_tokens=4096,
        enforce_eager=True,
    )


@pytest.fixture(scope="module")
def batch(tiny_model: Path) -> Iterator[OfflineBatchEngine]:
    engine = OfflineBatchEngine(config(tiny_model), max_num_seqs=32)
    system = engine.tokenizer.render(
        [ChatMessage("system", "You are opsbot. " * 40)], add_generation_prompt=False
    )
    engine.start(system)
    yield engine
    engine.shutdown()


def requests(engine: OfflineBatchEngine, n: int, max_tokens: int = 16) -> list[GenerationRequest]:
    sampling = SamplingSettings(temperature=0.0, top_p=1.0, max_tokens=max_tokens, ignore_eos=True)
    out = []
    for i in range(n):
        ids = engine.tokenizer.render(
            [
                ChatMessage("system", "You are opsbot. " * 40),
                ChatMessage("user", f"summarise alert group {i}"),
            ]
        )
        out.append(
            GenerationRequest(f"item-{i}", "alert_summary", Lane.BACKGROUND, sampling, prompt_token_ids=ids)
        )
    return out


def test_a_whole_set_runs_at_once_and_each_result_is_handed_over_as_it_finishes(
    batch: OfflineBatchEngine,
) -> None:
    done: dict[str, GenerationResult] = {}
    errors: dict[str, str] = {}

    def on_done(rid: str, result: GenerationResult | None, error: str | None) -> None:
        if result is not None:
            done[rid] = result
        else:
            errors[rid] = error or ""

    too_long = GenerationRequest(
        "too-long",
        "alert_summary",
        Lane.BACKGROUND,
        SamplingSettings(max_tokens=8),
        prompt_token_ids=[5] * 4096,
    )
    stats = batch.run([*requests(batch, 40), too_long], on_done, threading.Event())
    assert stats.finished == 40 and stats.failed == 1 and stats.aborted == 0
    assert set(done) == {f"item-{i}" for i in range(40)} and set(errors) == {"too-long"}
    assert all(r.output_tokens == 16 and r.finish_reason == "length" for r in done.values())
    assert all(r.cached_tokens > 0 for r in done.values())  # the warmed system prompt came from cache
    assert all(r.ttft_ms is not None and r.e2e_ms >= r.ttft_ms for r in done.values())
    assert batch.kv_capacity_tokens and batch.batch_width(200) == 32


def test_a_stop_aborts_what_still_runs_and_keeps_what_finished(batch: OfflineBatchEngine) -> None:
    stop = threading.Event()
    done: list[str] = []
    aborted: list[str] = []

    def on_done(rid: str, result: GenerationResult | None, error: str | None) -> None:
        (done if result is not None else aborted).append(rid)
        if len(done) >= 5:
            stop.set()

    stats = batch.run(requests(batch, 200, max_tokens=64), on_done, stop)
    assert stats.finished == len(done) >= 5
    assert stats.aborted == len(aborted) > 0 and len(done) + len(aborted) == 200
    again = batch.run(requests(batch, 4), lambda *a: None, threading.Event())
    assert again.finished == 4  # the engine is fine after a stop


def test_opsbot_analyze_on_vllm_runs_the_offline_path_and_writes_report_and_rows(
    tiny_model: Path, tmp_path: Path
) -> None:
    sys.path.insert(0, str(REPO / "bench"))
    from gen_alerts import generate_alerts

    shift = tmp_path / "shift.json"
    shift.write_text(json.dumps(generate_alerts(300)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPSBOT_")}
    env.update(
        {
            "OPSBOT_DATA_DIR": str(tmp_path / "data"),
            "OPSBOT_ENGINE__BACKEND": "vllm",
            "OPSBOT_ENGINE__MODEL": str(tiny_model),
            "OPSBOT_ENGINE__MAX_MODEL_LEN": "2048",
            "OPSBOT_ENGINE__ENFORCE_EAGER": "true",
            "OPSBOT_ENGINE__GPU_MEMORY_UTILIZATION": "0.25",
            "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
        }
    )
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "bot.cli", "analyze", str(shift), "--out", str(out), "--max-tokens", "16"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads((out / "report.json").read_text())
    assert report["run"]["mode"] == "offline" and report["totals"]["summarised"] == report["totals"]["groups"]
    assert (out / "counts.png").read_bytes().startswith(b"\x89PNG")
    with sqlite3.connect(tmp_path / "data" / "opsbot.db") as db:
        rows = db.execute("select scenario, lane, status from opsbot_requests").fetchall()
    assert len(rows) == report["totals"]["groups"] and set(rows) == {("batch", "background", "ok")}
