"""Engine faults on the CPU engine: its model fails mid-stream, or hangs until the watchdog catches it.

The faults are real: the model is the tiny test model with its own modeling code
(:mod:`inference.faultmodel`, loaded with ``engine.trust_remote_code``) whose forward pass raises or
blocks once the test drops a trigger file in the model folder. Every answer streaming at that moment
ends with the engine-down message in its thread, ``/readyz`` answers 503 until the engine is back,
and recovery follows ``engine.on_dead`` / ``engine.max_restarts``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from fakes.mattermost_server import FakeMattermost

from bot.adapters.mattermost import MattermostAdapter
from bot.app import EXIT_ENGINE_DEAD, OpsBot
from bot.config import Settings
from bot.pipeline import ENGINE_DEAD_TEXT
from inference.engine_set import EngineSet
from inference.faultmodel import build_fault_model, clear, trigger
from reliability.helpers import poll

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

FOOTER_MARK = "request `"
STREAMS = 4
LONG = {"max_tokens": 1500, "ignore_eos": True}


@pytest.fixture
def faulty(tiny_model: Path, tmp_path: Path) -> Path:
    return build_fault_model(tiny_model, tmp_path / "faulty-model")


class Bot:
    """An in-process opsbot (HTTP on a free port) on the faulty model, answering on fake Mattermost."""

    def __init__(self, mm: FakeMattermost, settings: Settings) -> None:
        self.mm = mm
        self.opsbot = OpsBot(settings)
        self.settings = settings
        self.alice = mm.add_user("alice")
        self.channel = mm.add_channel("incidents", [self.alice, mm.bot_user_id])
        self.readiness: list[tuple[float, int]] = []

    async def start(self) -> None:
        await self.opsbot.start_core()
        assert self.opsbot.store is not None
        await self.opsbot.start_service([MattermostAdapter(self.settings.mattermost, self.opsbot.store)])
        await poll(lambda: self.mm.live_connections() > 0, what="the websocket")

    async def ask(self, text: str) -> dict[str, Any]:
        return await self.mm.user_posts(self.alice, self.channel, f"@opsbot {text}")

    def replies(self, post: dict[str, Any]) -> list[str]:
        return [p["message"] for p in self.mm.bot_posts() if p["root_id"] == post["id"]]

    def streaming(self, post: dict[str, Any]) -> bool:
        """The answer has visible text and is not finished yet."""
        texts = self.replies(post)
        return bool(texts) and len(texts[0]) > 40 and FOOTER_MARK not in texts[0]

    async def watch_readiness(self) -> None:
        """Record every ``/readyz`` status, polling every 20 ms."""
        url = f"http://127.0.0.1:{self.opsbot.http_port}/readyz"
        async with aiohttp.ClientSession() as session:
            while True:
                async with session.get(url) as response:
                    self.readiness.append((time.monotonic(), response.status))
                await asyncio.sleep(0.02)


def settings_for(tmp_path: Path, model: Path, mm: FakeMattermost, **engine: Any) -> Settings:
    return Settings(
        data_dir=tmp_path,
        engine={
            "backend": "cpu",
            "model": str(model),
            "trust_remote_code": True,
            "max_model_len": 2048,
            "cpu_max_concurrency": STREAMS,
            **engine,
        },
        scenarios={"chat": LONG, "root_cause": LONG},
        http={"enabled": True, "host": "127.0.0.1", "port": 0},
        slo={"enabled": False},
        mattermost={
            "enabled": True,
            **mm.settings_kwargs(),
            "edit_interval_s": 0.2,
            "channel_post_interval_s": 0,
        },
    )


@pytest.fixture
async def mm() -> AsyncIterator[FakeMattermost]:
    async with FakeMattermost(rate_limit=None) as server:
        yield server


async def stream_then_fault(
    bot: Bot, faulty: Path, fault: str, *, hold_restart: bool = False
) -> tuple[list[dict[str, Any]], float, float]:
    """Start STREAMS answers, trigger ``fault`` while all stream; (posts, fault time, last note time).

    ``hold_restart``: the restarted engine's warm-up forward then hangs until the test clears the
    ``hang`` trigger, so its not-ready time lasts until the test has seen it (the tiny model
    restarts in about 0.2 s, shorter than a busy loop may take to answer one /readyz poll)."""
    posts = [await bot.ask(f"hello {i}, how are things?") for i in range(STREAMS)]
    await poll(lambda: all(bot.streaming(p) for p in posts), timeout_s=60, what="every answer streaming")
    trigger(faulty, fault)  # type: ignore[arg-type]
    if hold_restart:  # after the crash trigger: a forward checks it first, so the crash still fires
        trigger(faulty, "hang")
    at = time.monotonic()

    def noted() -> bool:
        return all(ENGINE_DEAD_TEXT in " ".join(bot.replies(p)) for p in posts)

    await poll(noted, timeout_s=30, what="the engine-down note in every thread")
    return posts, at, time.monotonic()


async def test_the_model_failing_mid_stream_ends_every_answer_with_a_note_and_the_engine_restarts(
    faulty: Path, tmp_path: Path, mm: FakeMattermost
) -> None:
    bot = Bot(mm, settings_for(tmp_path, faulty, mm, on_dead="restart", max_restarts=1))
    await bot.start()
    watcher = asyncio.create_task(bot.watch_readiness())
    try:
        posts, fault_at, noted_at = await stream_then_fault(bot, faulty, "crash", hold_restart=True)
        print(f"crash: {STREAMS} threads noted {noted_at - fault_at:.2f} s after the fault")
        await poll(lambda: any(s == 503 for t, s in bot.readiness if t > fault_at), what="/readyz 503")
        clear(faulty, "hang")  # the restart's warm-up goes on
        engine = bot.opsbot.engine
        assert engine is not None
        await poll(lambda: engine.health().ready, timeout_s=60, what="the restarted engine")
        after = await bot.ask("are you back?")
        await poll(lambda: any(FOOTER_MARK in t for t in bot.replies(after)), timeout_s=60, what="an answer")
        await poll(lambda: bot.readiness[-1][1] == 200, what="/readyz 200 again")
        assert bot.opsbot.exit_code == 0
    finally:
        watcher.cancel()
        clear(faulty)
        await bot.opsbot.shutdown()
    assert sorted(r["status"] for r in await requests(tmp_path)) == ["engine_dead"] * STREAMS + ["ok"]


async def test_a_hung_engine_is_caught_by_the_watchdog_and_handled_as_dead(
    faulty: Path, tmp_path: Path, mm: FakeMattermost
) -> None:
    stall_s = 1.5
    bot = Bot(mm, settings_for(tmp_path, faulty, mm, stall_timeout_s=stall_s, on_dead="restart"))
    await bot.start()
    watcher = asyncio.create_task(bot.watch_readiness())
    try:
        posts, hung_at, noted_at = await stream_then_fault(bot, faulty, "hang")
        print(f"hang: {STREAMS} threads noted {noted_at - hung_at:.2f} s after the hang (stall {stall_s} s)")
        # The restart's own warm-up forward hangs as long as the fault lasts: not ready meanwhile.
        await poll(lambda: any(s == 503 for t, s in bot.readiness if t > hung_at), what="/readyz 503")
        clear(faulty, "hang")
        engine = bot.opsbot.engine
        assert engine is not None
        await poll(lambda: engine.health().ready, timeout_s=60, what="the restarted engine")
        after = await bot.ask("are you back?")
        await poll(lambda: any(FOOTER_MARK in t for t in bot.replies(after)), timeout_s=60, what="an answer")
        default_engine = engine.get("default") if isinstance(engine, EngineSet) else engine
        assert getattr(default_engine, "stalls", None) == 1  # its AdmittedEngine's watchdog fired once
    finally:
        watcher.cancel()
        clear(faulty)
        await bot.opsbot.shutdown()
    assert sorted(r["status"] for r in await requests(tmp_path)) == ["engine_dead"] * STREAMS + ["ok"]


async def test_with_no_restart_left_the_bot_notes_every_thread_and_stops_with_exit_status_70(
    faulty: Path, tmp_path: Path, mm: FakeMattermost
) -> None:
    bot = Bot(mm, settings_for(tmp_path, faulty, mm, on_dead="restart", max_restarts=0))
    await bot.start()
    try:
        await stream_then_fault(bot, faulty, "crash")
        await poll(lambda: bot.opsbot._stop.is_set(), what="the bot to stop")
        assert bot.opsbot.exit_code == EXIT_ENGINE_DEAD
        engine = bot.opsbot.engine
        assert engine is not None and not engine.health().ready
    finally:
        await bot.opsbot.shutdown()
    assert sorted(r["status"] for r in await requests(tmp_path)) == ["engine_dead"] * STREAMS


async def requests(tmp_path: Path) -> list[Any]:
    import sqlite3

    with sqlite3.connect(tmp_path / "opsbot.db") as db:
        db.row_factory = sqlite3.Row
        return list(db.execute("SELECT status FROM opsbot_requests"))
