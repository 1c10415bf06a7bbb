"""The whole pipeline on vLLM (H200): a question through the real pipeline and store stores a
request row with vLLM's timings and the system prompt served from the prefix cache; ``opsbot chat``
on vLLM prints the answer on stdout with none of vLLM's own log lines mixed in."""

from __future__ import annotations

import asyncio
import io
import os
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from bot.adapters.console import ConsoleAdapter
from bot.app import OpsBot, submit_to
from bot.config import Settings

pytestmark = pytest.mark.asyncio(loop_scope="module")

REPO = Path(__file__).resolve().parents[2]
ENGINE = {
    "backend": "vllm",
    "dtype": "bfloat16",
    "gpu_memory_utilization": 0.25,
    "max_model_len": 2048,
    "max_num_seqs": 16,
    "max_num_batched_tokens": 4096,
    "enforce_eager": True,
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def bot(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[OpsBot]:
    data = tmp_path_factory.mktemp("opsbot-gpu-pipeline")
    settings = Settings(
        data_dir=data,
        engine={**ENGINE, "model": str(tiny_model)},
        scenarios={name: {"max_tokens": 24} for name in ("chat", "root_cause", "change_review")},
    )
    opsbot = OpsBot(settings)
    await opsbot.start_core()
    yield opsbot
    await opsbot.shutdown()


async def test_a_question_through_the_pipeline_stores_vllm_timings_and_cached_tokens(bot: OpsBot) -> None:
    assert bot.pipeline is not None and bot.store is not None and bot.engine is not None
    out = io.StringIO()
    adapter = ConsoleAdapter(stdin=io.StringIO(""), stdout=out)
    await adapter.start(submit_to(bot.pipeline, adapter))
    for question in ("which pods are failing in production?", "and what changed since yesterday?"):
        await adapter._submit(adapter.to_message(question))  # type: ignore[misc]
    assert "first token" in out.getvalue()
    while bot.store.buffered:
        await asyncio.sleep(0.05)
    rows = await _rows(bot.settings.data_dir / "opsbot.db")
    assert len(rows) == 2 and all(r["status"] == "ok" for r in rows)
    tokenizer = bot.engine.tokenizer
    system_tokens = len(tokenizer.render([_system(bot)], add_generation_prompt=False))
    block = bot.settings.engine.block_size
    for row in rows:
        assert row["ttft_ms"] > 0 and row["tpot_ms"] > 0 and row["queue_ms"] >= 0 and row["e2e_ms"] > 0
        assert row["output_tokens"] == 24 or row["output_tokens"] > 0
        assert row["cached_tokens"] >= (system_tokens // block) * block


def _system(bot: OpsBot) -> Any:
    from bot.prompts import load_system_prompt
    from inference.engine import ChatMessage

    return ChatMessage("system", load_system_prompt(bot.settings.prompt.system_prompt, None))


async def _rows(db: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("SELECT * FROM opsbot_requests ORDER BY created_at")]


def test_opsbot_chat_on_vllm_keeps_vllms_log_lines_off_stdout(tiny_model: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPSBOT_", "VLLM_LOGGING"))}
    env.update(
        {
            "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
            "XDG_DATA_HOME": str(tmp_path),
            "NO_COLOR": "1",
            "OPSBOT_ENGINE__MODEL": str(tiny_model),
            "OPSBOT_SCENARIOS": '{"chat": {"max_tokens": 16}, "root_cause": {"max_tokens": 16}}',
            **{
                f"OPSBOT_ENGINE__{k.upper()}": str(v).lower() if isinstance(v, bool) else str(v)
                for k, v in ENGINE.items()
            },
        }
    )
    proc = subprocess.run(
        [sys.executable, "-m", "bot.cli", "chat"],
        input="why is api-gateway crashlooping?\n/quit\n",
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    stdout = proc.stdout
    assert "first token" in stdout, stdout
    # vLLM's lines look like "INFO 12-01 10:00:00 [core.py:123] ..." or carry its logger name.
    leaked = [
        line
        for line in stdout.splitlines()
        if "vllm" in line.lower() or line.startswith(("INFO ", "WARNING "))
    ]
    assert leaked == [], "\n".join(leaked)
    assert "vllm" in proc.stderr.lower()  # they were written, to stderr
