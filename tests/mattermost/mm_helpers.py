"""Shared pieces of the Mattermost tests (constants, the running-bot handle, pipeline builder)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from bot.adapters.mattermost import MattermostAdapter
from bot.config import AnswerSettings
from bot.pipeline import Pipeline
from bot.prompts import PromptBuilder
from bot.store import Store
from inference.engine import Engine
from inference.scenarios import (
    ALERT_SUMMARY,
    CHANGE_REVIEW,
    CHAT,
    POSTMORTEM,
    ROOT_CAUSE,
    THREAD_SUMMARY,
    ScenarioRegistry,
)

SLASH_TOKEN = "slash-command-token"
ACTION_SECRET = "action-secret"
SYSTEM_PROMPT = "You are opsbot, an incident assistant. Answer briefly."


def make_pipeline(
    engine: Engine,
    store: Store,
    max_tokens: int = 3,
    *,
    ignore_eos: bool = False,
    answer: AnswerSettings | None = None,
) -> Pipeline:
    """The pipeline on ``engine`` with every scenario's answer capped at ``max_tokens`` (exactly that
    many with ``ignore_eos``: the random test model may otherwise stop at once); ``answer``: the
    ``[answer]`` settings (the watchdog)."""
    prompts = PromptBuilder(
        engine.tokenizer,
        system_prompt=SYSTEM_PROMPT,
        max_model_len=1024,
        context_share=0.3,
        history_share=0.2,
    )
    overrides = {
        name: {"max_tokens": max_tokens, "ignore_eos": ignore_eos}
        for name in (ALERT_SUMMARY, ROOT_CAUSE, CHANGE_REVIEW, CHAT, THREAD_SUMMARY, POSTMORTEM)
    }
    return Pipeline(
        engine=engine, store=store, prompts=prompts, scenarios=ScenarioRegistry(overrides), answer=answer
    )


@dataclass
class Bot:
    """One running opsbot Mattermost side: adapter, its HTTP routes, the pipeline behind it."""

    adapter: MattermostAdapter
    pipeline: Pipeline
    runner: web.AppRunner
    url: str
    stopped: bool = False

    @property
    def command_url(self) -> str:
        return self.url + "/mattermost/command"

    async def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        await self.adapter.stop()
        await self.pipeline.drain(10)
        await self.adapter.close()
        await self.runner.cleanup()


BotFactory = Callable[..., Awaitable[Bot]]


async def request_rows(store: Store, expected: int, timeout: float = 30.0) -> int:
    """Rows in ``opsbot_requests`` once ``expected`` are there (writes are buffered) or at the deadline."""
    import asyncio

    import sqlalchemy as sa

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        async with store.engine.connect() as conn:
            count = int((await conn.execute(sa.text("SELECT count(*) FROM opsbot_requests"))).scalar_one())
        if count >= expected or loop.time() > deadline:
            return count
        await asyncio.sleep(0.05)
