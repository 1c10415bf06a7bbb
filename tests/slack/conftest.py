"""Fixtures of the Slack tests: the fake Slack, and whole opsbots (store, CPU engine on the tiny
test model, pipeline, Slack adapter) pointed at it by configuration."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fakes.slack_harness import BotFactory, SlackBot, start_bot, stop_bot
from fakes.slack_server import FakeSlack
from fixtures_pg import pg_url  # noqa: F401  (re-exported fixture)


@pytest.fixture(autouse=True)
def _quiet_libraries() -> None:
    # slack_sdk logs every socket frame at DEBUG; keep failures readable
    logging.getLogger("slack_sdk").setLevel(logging.WARNING)
    logging.getLogger("bot.adapters.slack.socket").setLevel(logging.WARNING)


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as fake:
        yield fake


@pytest.fixture
async def make_bot(tiny_model: Path, tmp_path: Path, slack: FakeSlack) -> AsyncIterator[BotFactory]:
    """Start a whole opsbot against the fake: ``await make_bot(mode=..., db_url=..., **slack)``."""
    bots: list[SlackBot] = []

    async def _make(**kwargs: Any) -> SlackBot:
        bot = await start_bot(slack, tiny_model, tmp_path, **kwargs)
        bots.append(bot)
        return bot

    yield _make
    for bot in reversed(bots):
        await stop_bot(bot)
