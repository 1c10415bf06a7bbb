"""Small helpers shared by the Slack tests: starting a whole opsbot against the fake, and readers
over the fake Slack's record."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from fakes.slack_server import FakeMessage, FakeSlack

from bot.adapters.slack import SlackAdapter
from bot.app import submit_to
from bot.config import Settings, SlackSettings
from bot.engine_factory import build_engine
from bot.pipeline import Pipeline
from bot.prompts import PromptBuilder, load_system_prompt
from bot.store import Store
from inference.engine import Engine
from inference.scenarios import ScenarioRegistry

SHORT = {"max_tokens": 8}
"""Every scenario answers in a few tokens: the tests are about delivery, not content."""


PINNED: dict[str, Any] = {
    "streaming": "edit",
    "post_placeholder": "always",
    "channel_post_burst": 1,
    "ack_fallback_text": "",
}
"""Settings the older delivery tests were written for (before native streaming, burst posting and
ephemeral signs of life: their fault rules count chat.* calls one target at a time)."""
DEFAULTS: dict[str, Any] = {name: SlackSettings.model_fields[name].default for name in PINNED}
"""The shipped defaults of the pinned settings: ``make_bot(**DEFAULTS)`` runs opsbot as shipped."""


def slack_settings(fake: FakeSlack, mode: str = "socket", **overrides: Any) -> SlackSettings:
    values: dict[str, Any] = {
        "enabled": True,
        "mode": mode,
        "bot_token": fake.bot_token,
        "app_token": fake.app_token,
        "signing_secret": fake.signing_secret,
        "api_base_url": fake.api_url,
        "socket_ping_interval_s": 0.5,
        "retry": {"initial_s": 0.05},
        # The delivery mechanics the older tests pin down: post-and-edit, a placeholder at once,
        # one post per interval per channel. Tests of the defaults pass ``**DEFAULTS``.
        **PINNED,
    }
    values.update(overrides)
    return SlackSettings(**values)


@dataclass
class SlackBot:
    """One running opsbot as the tests see it."""

    settings: Settings
    store: Store
    engine: Engine
    pipeline: Pipeline
    adapter: SlackAdapter
    runner: web.AppRunner | None = None
    port: int | None = None

    @property
    def events_url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.settings.slack.events_path}"


BotFactory = Callable[..., Awaitable[SlackBot]]


async def start_bot(
    fake: FakeSlack,
    model: Path,
    data_dir: Path,
    *,
    mode: str = "socket",
    db_url: str | None = None,
    admission: dict[str, Any] | None = None,
    wrap_engine: Callable[[Engine], Engine] | None = None,
    max_tokens: int | None = None,
    **slack_overrides: Any,
) -> SlackBot:
    """Store -> CPU engine -> pipeline -> Slack adapter (and its HTTP routes), as bot/app.py wires them."""
    settings = Settings(
        data_dir=data_dir,
        engine={"backend": "cpu", "model": str(model), "max_model_len": 1024, "drain_timeout_s": 2},
        store={"url": db_url or f"sqlite+aiosqlite:///{data_dir / 'opsbot.db'}"},
        scenarios=dict.fromkeys(
            ("chat", "root_cause", "change_review", "alert_summary", "thread_summary", "postmortem"),
            SHORT if max_tokens is None else {"max_tokens": max_tokens},
        ),
        admission=admission or {},
        slack=slack_settings(fake, mode, **slack_overrides).model_dump(mode="python"),
    )
    store = await Store.open(settings.store_url, settings.store)
    engine = build_engine(settings, str(model))
    await engine.start()  # the CPU engine's tokenizer exists only once started
    if wrap_engine is not None:
        engine = wrap_engine(engine)
    prompts = PromptBuilder(
        engine.tokenizer,
        system_prompt=load_system_prompt(None, None),
        max_model_len=settings.engine.max_model_len,
        context_share=settings.prompt.context_share,
        history_share=settings.prompt.history_share,
    )
    pipeline = Pipeline(
        engine=engine,
        store=store,
        prompts=prompts,
        scenarios=ScenarioRegistry(settings.scenarios),
        model_name="tiny",
    )
    adapter = SlackAdapter(settings.slack, store)
    bot = SlackBot(settings, store, engine, pipeline, adapter)
    routes = adapter.http_routes()
    if routes:
        app = web.Application()
        app.add_routes(routes)
        bot.runner = web.AppRunner(app, access_log=None)
        await bot.runner.setup()
        site = web.TCPSite(bot.runner, "127.0.0.1", 0)
        await site.start()
        bot.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    await adapter.start(submit_to(pipeline, adapter))
    return bot


async def stop_bot(bot: SlackBot) -> None:
    """Shut a bot down the way bot/app.py does: adapter, drain, HTTP, engine, store."""
    await bot.adapter.stop()
    await bot.pipeline.drain(2.0)
    await bot.adapter.close()
    if bot.runner is not None:
        await bot.runner.cleanup()
        bot.runner = None
    await bot.engine.shutdown(1.0)
    await bot.store.close()


def has_footer(msg: FakeMessage) -> bool:
    return any(b.get("type") == "context" for b in (msg.blocks or []))


def answers(slack: FakeSlack, channel: str | None = None) -> list[FakeMessage]:
    """Finished answers: bot messages whose last edit (or post) carries the footer."""
    return [m for m in slack.bot_messages(channel) if has_footer(m)]


def feedback_action_ids(msg: FakeMessage) -> list[str]:
    out: list[str] = []
    for block in msg.blocks or []:
        if block.get("type") == "actions":
            out += [e["action_id"] for e in block["elements"]]
    return out


async def settled(*bots: SlackBot, timeout_s: float = 30.0) -> None:
    """Wait until no bot has work in progress (the pipeline owns all of it)."""
    deadline = time.monotonic() + timeout_s
    while any(b.pipeline.in_flight for b in bots):
        if time.monotonic() > deadline:
            raise AssertionError("adapters still busy")
        await asyncio.sleep(0.05)


async def request_rows(store: Any, timeout_s: float = 20.0) -> list[tuple[str, str, str]]:
    """``(channel, thread_id, status)`` of every request row, once the write buffer is empty."""
    from sqlalchemy import select

    from bot.store.models import RequestRow

    deadline = time.monotonic() + timeout_s
    while store.buffered:
        if time.monotonic() > deadline:
            raise AssertionError("store buffer not flushed")
        await asyncio.sleep(0.05)
    async with store.engine.connect() as conn:
        rows = (await conn.execute(select(RequestRow.channel, RequestRow.thread_id, RequestRow.status))).all()
    return [(r[0], r[1], r[2]) for r in rows]
