"""Fixtures of the Mattermost tests: the fake server, a store, the CPU engine on the tiny model,
and opsbot's adapter + HTTP routes + the real pipeline on free ports, pointed at the fake."""

from __future__ import annotations

import socket
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from fakes.mattermost_server import FakeMattermost

# Test modules see their own folder on sys.path, conftest files do not (pytest's prepend mode).
sys.path.insert(0, str(Path(__file__).parent))
from mm_helpers import ACTION_SECRET, SLASH_TOKEN, Bot, BotFactory, make_pipeline  # noqa: E402

from bot.adapters.mattermost import MattermostAdapter
from bot.app import submit_to
from bot.config import AnswerSettings, MattermostSettings, StoreSettings
from bot.store import Store
from inference.config import EngineConfig
from inference.cpu_engine import CpuEngine
from inference.engine import Engine


@pytest.fixture
async def fake() -> AsyncIterator[FakeMattermost]:
    async with FakeMattermost() as mm:
        yield mm


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = await Store.open(
        f"sqlite+aiosqlite:///{tmp_path / 'opsbot.db'}",
        StoreSettings(retry={"initial_s": 0.02, "max_s": 0.2}, busy_timeout_ms=5000),
    )
    try:
        yield opened
    finally:
        await opened.close(flush_timeout_s=5)


@pytest.fixture
async def engine(tiny_model: Path) -> AsyncIterator[Engine]:
    eng = CpuEngine(
        EngineConfig(model=str(tiny_model), cpu_max_concurrency=2, cpu_threads=1, max_model_len=1024)
    )
    await eng.start()
    try:
        yield eng
    finally:
        await eng.shutdown(1.0)


@pytest.fixture
async def start_bot(fake: FakeMattermost, engine: Engine, store: Store) -> AsyncIterator[BotFactory]:
    """``await start_bot(max_tokens=..., **settings)``: a started bot; stopped after the test."""
    bots: list[Bot] = []

    async def factory(
        *,
        max_tokens: int = 3,
        ignore_eos: bool = False,
        bot_store: Store | None = None,
        wrap_engine: Callable[[Engine], Engine] | None = None,
        answer_stall_s: float | None = 120.0,
        **overrides: Any,
    ) -> Bot:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        fields: dict[str, Any] = {
            "enabled": True,
            **fake.settings_kwargs(),
            "slash_command_token": SLASH_TOKEN,
            "action_secret": ACTION_SECRET,
            "public_url": url,
            "edit_interval_s": 0.2,
            "websocket_silence_s": 2.0,
            "reconnect": {"initial_s": 0.05, "max_s": 0.5},
            "retry": {"initial_s": 0.05, "max_s": 0.3},
            "channel_post_interval_s": 0.0,
            "request_timeout_s": 10.0,
            # The older delivery tests watch the placeholder being edited: pin it (tests of the
            # shipped default pass post_placeholder="auto").
            "post_placeholder": "always",
        }
        fields.update(overrides)
        settings = MattermostSettings(**fields)
        the_store = bot_store or store
        adapter = MattermostAdapter(settings, the_store)
        pipeline = make_pipeline(
            wrap_engine(engine) if wrap_engine else engine,
            the_store,
            max_tokens,
            ignore_eos=ignore_eos,
            answer=AnswerSettings(stall_s=answer_stall_s),
        )
        app = web.Application()
        app.add_routes(adapter.http_routes())
        runner = web.AppRunner(app, handle_signals=False)
        await runner.setup()
        await web.SockSite(runner, sock).start()

        await adapter.start(submit_to(pipeline, adapter))
        bot = Bot(adapter, pipeline, runner, url)
        bots.append(bot)
        return bot

    yield factory
    for bot in reversed(bots):
        await bot.stop()
