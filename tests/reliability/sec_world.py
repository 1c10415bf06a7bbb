"""One whole opsbot as the security tests see it: the fake Slack and fake Mattermost servers, a
SQLite store on disk, the CPU engine on the tiny model, the real pipeline, the real Slack (HTTP
Events API mode) and Mattermost adapters, the Alertmanager receiver, and opsbot's own HTTP app
(``bot.http.build_http_app``, middleware included) serving all their routes on a free port.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from fakes.mattermost_server import FakeMattermost
from fakes.recording_engine import RecordingEngine
from fakes.slack_harness import slack_settings
from fakes.slack_server import FakeSlack

from bot.adapters.alertmanager import AlertmanagerReceiver
from bot.adapters.mattermost import MattermostAdapter
from bot.adapters.slack import SlackAdapter
from bot.app import submit_to
from bot.config import MattermostSettings, Settings, StoreSettings
from bot.context.gatherer import ContextGatherer
from bot.http import build_http_app
from bot.pipeline import Pipeline
from bot.prompts import DEFAULT_SYSTEM_PROMPT, PromptBuilder
from bot.store import Store
from inference.config import EngineConfig
from inference.cpu_engine import CpuEngine
from inference.scenarios import ScenarioRegistry

SLASH_TOKEN = "mm-slash-token"
ACTION_SECRET = "mm-action-secret"
ALERT_TOKEN = "am-bearer-token"
MAX_BODY = 64 * 1024
"""The body limit the fuzzed app runs with (small, so oversized bodies are cheap to send)."""


class Records(logging.Handler):
    """Every log record of the run, for asserting that nothing unhandled was logged."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def problems(self) -> list[str]:
        """ERROR-or-worse records and any record carrying a traceback."""
        return [
            f"{r.name} {r.levelname} {r.getMessage()[:300]}"
            for r in self.records
            if r.levelno >= logging.ERROR or r.exc_info
        ]


@dataclass
class World:
    slack: FakeSlack
    mm: FakeMattermost
    store: Store
    engine: RecordingEngine
    pipeline: Pipeline
    slack_adapter: SlackAdapter
    mm_adapter: MattermostAdapter
    receiver: AlertmanagerReceiver
    base_url: str
    session: aiohttp.ClientSession
    logs: Records
    db: Path
    mm_user: str = ""
    mm_channel: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def slack_url(self) -> str:
        return self.base_url + self.slack_adapter.settings.events_path


def free_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


@asynccontextmanager
async def world(
    model: Path, data_dir: Path, *, max_tokens: int = 3, kubeconfig: Path | None = None
) -> AsyncIterator[World]:
    """Start everything; stop it all afterwards (in the order bot/app.py does). With ``kubeconfig``
    (a fake cluster's), Kubernetes context is gathered for every question."""
    logs = Records()
    root = logging.getLogger()
    root.addHandler(logs)
    old_level = root.level
    root.setLevel(logging.INFO)
    slack = FakeSlack()
    await slack.start()
    mm = FakeMattermost()
    await mm.start()
    db = data_dir / "opsbot.db"
    store = await Store.open(
        f"sqlite+aiosqlite:///{db}", StoreSettings(retry={"initial_s": 0.02, "max_s": 0.2})
    )
    inner = CpuEngine(
        EngineConfig(model=str(model), cpu_max_concurrency=2, cpu_threads=1, max_model_len=2048)
    )
    await inner.start()
    engine = RecordingEngine(inner)  # keeps every GenerationRequest: scenario, lane, sampling, prompt
    prompts = PromptBuilder(
        engine.tokenizer,
        system_prompt=DEFAULT_SYSTEM_PROMPT,
        max_model_len=2048,
        context_share=0.5,
        history_share=0.1,
    )
    scenarios = {
        name: {"max_tokens": max_tokens}
        for name in ("chat", "root_cause", "alert_summary", "change_review", "thread_summary", "postmortem")
    }
    sock = free_socket()
    base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    kube: dict[str, Any] = {}
    if kubeconfig is not None:
        kube = {"enabled": True, "kubeconfig": kubeconfig, "context": "fake-cluster", "timeout_s": 30.0}
    settings = Settings(
        data_dir=data_dir,
        slack=slack_settings(slack, "http").model_dump(mode="python"),
        alertmanager={"enabled": True, "bearer_token": ALERT_TOKEN, "targets": ["slack:C0ALERTS"]},
        kubernetes=kube,
        # generous: two shared cores and a CPU engine make the fake API server slow at times
        context={"timeout_s": 30.0},
    )
    context = ContextGatherer.from_settings(settings)
    pipeline = Pipeline(
        engine=engine,
        store=store,
        prompts=prompts,
        scenarios=ScenarioRegistry(scenarios),
        context=context,
        model_name="tiny",
    )
    slack_adapter = SlackAdapter(settings.slack, store)
    mm_settings = MattermostSettings(
        enabled=True,
        **mm.settings_kwargs(),
        slash_command_token=SLASH_TOKEN,
        action_secret=ACTION_SECRET,
        public_url=base_url,
        edit_interval_s=0.2,
        channel_post_interval_s=0.0,
        retry={"initial_s": 0.05, "max_s": 0.3},
        reconnect={"initial_s": 0.05, "max_s": 0.5},
    )
    mm_adapter = MattermostAdapter(mm_settings, store)
    receiver = AlertmanagerReceiver(settings, store, pipeline, {"slack": slack_adapter})
    app = build_http_app(
        engine=engine,
        store=store,
        routes=[*slack_adapter.http_routes(), *mm_adapter.http_routes(), *receiver.http_routes()],
        max_body_bytes=MAX_BODY,
    )
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    await slack_adapter.start(submit_to(pipeline, slack_adapter))
    await mm_adapter.start(submit_to(pipeline, mm_adapter))
    session = aiohttp.ClientSession()
    w = World(
        slack, mm, store, engine, pipeline, slack_adapter, mm_adapter, receiver, base_url, session, logs, db
    )
    w.extra["settings"] = settings
    try:
        yield w
    finally:
        await session.close()
        receiver.stop()
        await slack_adapter.stop()
        await mm_adapter.stop()
        await pipeline.drain(5)
        await slack_adapter.close()
        await mm_adapter.close()
        await runner.cleanup()
        await context.close()
        await engine.shutdown(1.0)
        await store.close()
        await mm.close()
        await slack.close()
        root.removeHandler(logs)
        root.setLevel(old_level)
