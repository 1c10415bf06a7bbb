"""One engine per scenario in one process: two real CPU engines (the tiny offline model in two
folders, two configurations) wired by ``OpsBot.start_core`` as ``opsbot run`` wires them; a
root-cause question goes to one, an alert summary to the other; the rows, ``/rca status``,
``opsbot stats --by engine``, ``/readyz`` and ``/metrics`` name them; one engine dying flips
readiness and fails only its own scenarios."""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest

from bot.adapters.console import ConsoleAdapter
from bot.app import OpsBot, submit_to
from bot.config import Settings
from bot.http import build_http_app, start_http
from bot.pipeline import Pipeline
from bot.store import RequestRecord, Store
from inference.cpu_engine import CpuEngine
from inference.engine import EngineStartupError
from inference.engine_set import EngineSet, UnknownEngineError
from inference.scenarios import ALERT_SUMMARY, ROOT_CAUSE

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(300)


@dataclass
class Bot:
    app: OpsBot
    pipeline: Pipeline
    engines: EngineSet
    store: Store
    adapter: ConsoleAdapter
    out: io.StringIO
    db: Path
    models: dict[str, Path]


@pytest.fixture
async def bot(tiny_model: Path, tmp_path: Path) -> AsyncIterator[Bot]:
    """``[engine]`` (default, answers alert summaries and the rest) on one folder of the tiny model
    and ``[engines.rca]`` (answers root cause, its own context window) on a copy in another."""
    rca_model = tmp_path / "rca-model"
    shutil.copytree(tiny_model, rca_model)
    db = tmp_path / "opsbot.db"
    settings = Settings(
        data_dir=tmp_path,
        store={"url": f"sqlite+aiosqlite:///{db}"},
        http={"enabled": False},
        engine={"backend": "cpu", "model": str(tiny_model), "max_model_len": 2048},
        engines={"rca": {"backend": "cpu", "model": str(rca_model), "max_model_len": 1024, "cpu_threads": 1}},
        scenarios={
            ROOT_CAUSE: {"engine": "rca", "max_tokens": 8},
            ALERT_SUMMARY: {"max_tokens": 8},
            "chat": {"max_tokens": 8},
        },
    )
    app = OpsBot(settings, progress=lambda line: None)
    pipeline = await app.start_core()
    assert isinstance(app.engine, EngineSet) and app.store is not None
    out = io.StringIO()
    adapter = ConsoleAdapter(stdin=io.StringIO(""), stdout=out)
    await adapter.start(submit_to(pipeline, adapter))
    try:
        yield Bot(
            app, pipeline, app.engine, app.store, adapter, out, db, {"default": tiny_model, "rca": rca_model}
        )
    finally:
        await app.shutdown()


async def ask(bot: Bot, text: str, scenario: str | None = None) -> None:
    message = bot.adapter.to_message(text)
    message.scenario = scenario
    await bot.pipeline.handle(message, bot.adapter)


async def rows(bot: Bot, count: int) -> list[RequestRecord]:
    now = datetime.now(UTC)
    for _ in range(200):
        found = await bot.store.requests_between(now - timedelta(hours=1), now + timedelta(minutes=1))
        if len(found) >= count:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"expected {count} request rows, found {found}")


async def test_root_cause_and_alert_summary_go_to_their_engines_and_rows_name_them(bot: Bot) -> None:
    assert bot.engines.names == ["default", "rca"]
    assert bot.engines.name_for(ROOT_CAUSE) == "rca" and bot.engines.name_for(ALERT_SUMMARY) == "default"
    # Each engine has its own admission controller (one engine's queue never holds up another's).
    default, rca = bot.engines.get("default"), bot.engines.get("rca")
    assert default.controller is not rca.controller  # type: ignore[attr-defined]
    # ... and its own prompt budget: the rca engine was configured with a smaller context window.
    assert bot.pipeline.prompts_by_engine["rca"].max_model_len == 1024
    assert bot.pipeline.prompts_by_engine["default"].max_model_len == 2048

    await ask(bot, "why is checkout-api returning 503s?")
    await ask(bot, "summarise the alert", scenario=ALERT_SUMMARY)
    found = {r.scenario: r for r in await rows(bot, 2)}
    assert found[ROOT_CAUSE].engine == "rca" and found[ROOT_CAUSE].status == "ok"
    assert found[ROOT_CAUSE].model == str(bot.models["rca"])
    assert found[ALERT_SUMMARY].engine == "default" and found[ALERT_SUMMARY].status == "ok"
    assert found[ALERT_SUMMARY].model == str(bot.models["default"])
    assert found[ROOT_CAUSE].output_tokens > 0 and found[ALERT_SUMMARY].output_tokens > 0


async def test_status_names_every_engine_with_its_scenarios(bot: Bot) -> None:
    await ask(bot, "why is checkout-api returning 503s?")
    await rows(bot, 1)
    status = await bot.pipeline.status_text()
    assert "2 engines: ready" in status
    assert f"engine `default` — cpu, model `{bot.models['default']}`" in status
    assert f"engine `rca` — cpu, model `{bot.models['rca']}`" in status
    assert "answers root_cause: ready" in status
    assert "answers every scenario not routed" in status
    rca_line = next(line for line in status.splitlines() if "engine `rca`" in line)
    rca_next = status.splitlines()[status.splitlines().index(rca_line) + 1]
    assert "(1 answer)" in rca_next  # the root-cause answer is the rca engine's


async def test_one_engine_dying_flips_readiness_and_fails_only_its_scenarios(bot: Bot) -> None:
    app = build_http_app(engine=bot.engines, store=bot.store)
    runner, port = await start_http(app, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/readyz") as resp:
                assert resp.status == 200
            async with http.get(f"{base}/metrics") as resp:
                body = await resp.text()
            assert 'opsbot_engine_ready{engine="default"} 1.0' in body
            assert 'opsbot_engine_ready{engine="rca"} 1.0' in body

            await bot.engines.get("rca").shutdown(1)
            async with http.get(f"{base}/readyz") as resp:
                data = await resp.json()
            assert resp.status == 503 and "engine rca" in data["reason"]
            assert "engine default" not in data["reason"]
            async with http.get(f"{base}/metrics") as resp:
                body = await resp.text()
            assert 'opsbot_engine_ready{engine="rca"} 0.0' in body
            assert 'opsbot_engine_ready{engine="default"} 1.0' in body
    finally:
        await runner.cleanup()
    await ask(bot, "why is checkout-api returning 503s?")
    await ask(bot, "summarise the alert", scenario=ALERT_SUMMARY)
    found = {r.scenario: r for r in await rows(bot, 2)}
    # A stopped CPU engine refuses new work as shutting down; a dead vLLM core reports engine_dead.
    assert found[ROOT_CAUSE].status in ("aborted", "engine_dead") and found[ROOT_CAUSE].engine == "rca"
    assert found[ALERT_SUMMARY].status == "ok" and found[ALERT_SUMMARY].engine == "default"
    status = await bot.pipeline.status_text()
    assert "2 engines: NOT READY (engine rca:" in status


async def test_opsbot_stats_by_engine_groups_the_rows_by_the_engine_that_answered(bot: Bot) -> None:
    await ask(bot, "why is checkout-api returning 503s?")
    await ask(bot, "why are pods of payments restarting?")
    await ask(bot, "summarise the alert", scenario=ALERT_SUMMARY)
    await rows(bot, 3)
    await bot.store.close()  # flushed; the CLI reads the file as a user would
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPSBOT_")}
    env.update(
        {
            "OPSBOT_STORE__URL": f"sqlite+aiosqlite:///{bot.db}",
            "OPSBOT_LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(REPO),
        }
    )
    done = subprocess.run(
        [sys.executable, "-m", "bot.cli", "stats", "--since", "1h", "--by", "engine", "--json"],
        cwd=bot.db.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    counts = {g["engine"]: g["count"] for g in report["groups"]}
    assert counts == {"default": 1, "rca": 2}
    bot.app.store = None  # closed above


async def test_a_failed_start_of_one_engine_stops_the_ones_started_and_names_it(
    tiny_model: Path, tmp_path: Path
) -> None:
    first = CpuEngine(Settings(engine={"backend": "cpu", "model": str(tiny_model)}).engine)
    broken = CpuEngine(Settings(engine={"backend": "cpu", "model": str(tmp_path / "missing")}).engine)
    engines = EngineSet({"default": first, "broken": broken}, {ROOT_CAUSE: "broken"})
    with pytest.raises(EngineStartupError) as info:
        await engines.start()
    assert "while starting engine 'broken'" in "".join(getattr(info.value, "__notes__", []))
    assert first.health().ready is False  # shut down again, not left holding memory
    assert "engine broken" in engines.health().reason


def test_a_route_to_an_engine_the_set_lacks_is_refused(tiny_model: Path) -> None:
    engine = CpuEngine(Settings(engine={"backend": "cpu", "model": str(tiny_model)}).engine)
    with pytest.raises(UnknownEngineError, match="routed to engine 'int4'"):
        EngineSet({"default": engine}, {ALERT_SUMMARY: "int4"})
    with pytest.raises(UnknownEngineError, match="default engine 'default' is not in the set"):
        EngineSet({"rca": engine})
