"""Fixtures for pipeline-level tests: the real CPU engine on the tiny model and a SQLite store."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bot.adapters.console import ConsoleAdapter
from bot.app import submit_to
from bot.config import Settings, StoreSettings
from bot.engine_factory import build_engine
from bot.pipeline import Pipeline
from bot.prompts import DEFAULT_SYSTEM_PROMPT, PromptBuilder
from bot.store import Store
from inference.engine import ChatMessage, Engine
from inference.scenarios import ScenarioRegistry


@dataclass
class Parts:
    pipeline: Pipeline
    engine: Engine
    store: Store
    adapter: ConsoleAdapter
    out: io.StringIO
    db_url: str


@pytest.fixture
async def parts(tiny_model: Path, tmp_path: Path) -> AsyncIterator[Parts]:
    """A pipeline with the real CPU engine, a SQLite file and a terminal adapter writing to a buffer."""
    settings = Settings(
        data_dir=tmp_path,
        engine={"backend": "cpu", "model": str(tiny_model), "max_model_len": 2048},
        scenarios={
            name: {"max_tokens": 12} for name in ("chat", "root_cause", "alert_summary", "change_review")
        },
    )
    db_url = f"sqlite+aiosqlite:///{tmp_path / 'opsbot.db'}"
    store = await Store.open(db_url, StoreSettings(retry={"initial_s": 0.02, "max_s": 0.2}))
    engine = build_engine(settings, str(tiny_model))
    await engine.start([ChatMessage("system", DEFAULT_SYSTEM_PROMPT)])
    prompts = PromptBuilder(
        engine.tokenizer,
        system_prompt=DEFAULT_SYSTEM_PROMPT,
        max_model_len=2048,
        context_share=0.4,
        history_share=0.2,
    )
    pipeline = Pipeline(
        engine=engine,
        store=store,
        prompts=prompts,
        scenarios=ScenarioRegistry(settings.scenarios),
        model_name="tiny",
    )
    out = io.StringIO()
    adapter = ConsoleAdapter(stdin=io.StringIO(""), stdout=out)
    await adapter.start(submit_to(pipeline, adapter))
    try:
        yield Parts(pipeline, engine, store, adapter, out, db_url)
    finally:
        await engine.shutdown(5)
        await store.close()
