"""Two vLLM engines in one process sharing one GPU by memory fraction (H200), wired from settings
by ``OpsBot.start_core`` as ``opsbot run`` wires them: ``[engine]`` bf16 at 0.25 of the GPU and
``[engines.rca]`` (its own folder and context window) at 0.2; root cause goes to one, alert summaries to
the other; rows and ``/rca status`` name them; each engine reports its own KV cache; one engine
stopped makes the set not ready and fails only its scenarios."""

from __future__ import annotations

import asyncio
import io
import shutil
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from bot.adapters.console import ConsoleAdapter
from bot.app import OpsBot
from bot.config import Settings
from inference.engine_set import EngineSet
from inference.scenarios import ALERT_SUMMARY, ROOT_CAUSE

pytestmark = pytest.mark.asyncio(loop_scope="module")

ENGINE = {
    "backend": "vllm",
    "dtype": "bfloat16",
    "max_model_len": 2048,
    "max_num_seqs": 16,
    "max_num_batched_tokens": 4096,
    "enforce_eager": True,
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def bot(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[OpsBot]:
    data = tmp_path_factory.mktemp("opsbot-gpu-engine-set")
    rca_model = data / "rca-model"
    shutil.copytree(tiny_model, rca_model)
    settings = Settings(
        data_dir=data,
        engine={**ENGINE, "model": str(tiny_model), "gpu_memory_utilization": 0.25},
        engines={
            "rca": {**ENGINE, "model": str(rca_model), "gpu_memory_utilization": 0.2, "max_model_len": 1024}
        },
        scenarios={
            ROOT_CAUSE: {"engine": "rca", "max_tokens": 16},
            ALERT_SUMMARY: {"max_tokens": 16},
            "chat": {"max_tokens": 16},
        },
    )
    opsbot = OpsBot(settings)
    await opsbot.start_core()
    yield opsbot
    await opsbot.shutdown()


async def _rows(db: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("SELECT * FROM opsbot_requests ORDER BY created_at")]


async def _ask(bot: OpsBot, adapter: ConsoleAdapter, text: str, scenario: str | None = None) -> None:
    assert bot.pipeline is not None
    message = adapter.to_message(text)
    message.scenario = scenario
    await bot.pipeline.handle(message, adapter)


async def test_two_vllm_engines_share_the_gpu_and_answer_their_own_scenarios(bot: OpsBot) -> None:
    assert isinstance(bot.engine, EngineSet) and bot.store is not None and bot.pipeline is not None
    assert bot.engine.health().ready, bot.engine.health().reason
    adapter = ConsoleAdapter(stdin=io.StringIO(""), stdout=io.StringIO())
    await _ask(bot, adapter, "why is checkout-api returning 503s?")
    await _ask(bot, adapter, "summarise the alert", scenario=ALERT_SUMMARY)
    while bot.store.buffered:
        await asyncio.sleep(0.05)
    rows = {r["scenario"]: r for r in await _rows(bot.settings.data_dir / "opsbot.db")}
    assert rows[ROOT_CAUSE]["engine"] == "rca" and rows[ROOT_CAUSE]["status"] == "ok"
    assert rows[ALERT_SUMMARY]["engine"] == "default" and rows[ALERT_SUMMARY]["status"] == "ok"
    assert rows[ROOT_CAUSE]["ttft_ms"] > 0 and rows[ALERT_SUMMARY]["ttft_ms"] > 0
    stats = bot.engine.stats_by_engine()
    assert stats["rca"].model != stats["default"].model
    assert all(s.kv_cache_usage is not None for s in stats.values())
    status = await bot.pipeline.status_text()
    assert "2 engines: ready" in status and "engine `rca` — vllm" in status and "answers root_cause" in status


async def test_stopping_one_engine_makes_the_set_not_ready_and_fails_only_its_scenarios(bot: OpsBot) -> None:
    assert isinstance(bot.engine, EngineSet) and bot.store is not None
    await bot.engine.get("rca").shutdown(drain_timeout_s=5)
    health = bot.engine.health()
    assert not health.ready and "engine rca" in health.reason and "engine default" not in health.reason
    adapter = ConsoleAdapter(stdin=io.StringIO(""), stdout=io.StringIO())
    await _ask(bot, adapter, "why are the payments pods restarting?")
    await _ask(bot, adapter, "summarise the alert", scenario=ALERT_SUMMARY)
    while bot.store.buffered:
        await asyncio.sleep(0.05)
    last = (await _rows(bot.settings.data_dir / "opsbot.db"))[-2:]
    by_scenario = {r["scenario"]: r for r in last}
    assert by_scenario[ROOT_CAUSE]["status"] != "ok" and by_scenario[ROOT_CAUSE]["engine"] == "rca"
    assert by_scenario[ALERT_SUMMARY]["status"] == "ok"
