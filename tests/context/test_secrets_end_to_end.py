"""End to end over the planted corpus: no secret in any prompt, reply, stored row or log line, and
every prompt-injection string sits inside a data fence.

The real pipeline runs on the real CPU engine with the real Kubernetes provider reading the fake
API server's corpus cluster; the Alertmanager corpus arrives as an alert. The engine is wrapped
only to record the token ids it is sent, and in one test to make the "model" repeat a secret, since
a random-weight model cannot be asked to leak one.
"""

from __future__ import annotations

import io
import logging
import re
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from corpus import INJECTIONS, SECRETS, corpus_alert, corpus_cluster

from bot.adapters.console import ConsoleAdapter
from bot.config import Settings, StoreSettings
from bot.context.gatherer import ContextGatherer
from bot.engine_factory import build_engine
from bot.logs import setup_logging
from bot.pipeline import Pipeline
from bot.prompts import DEFAULT_SYSTEM_PROMPT, PromptBuilder
from bot.store import Store
from bot.types import IncomingMessage, MessageKind
from inference.engine import (
    ChatMessage,
    Engine,
    GenerationEvent,
    GenerationRequest,
    TextDelta,
    WrappedEngine,
)
from inference.scenarios import ScenarioRegistry

POD = "leaky-7d9f8c6b5-q8w2e"
_FENCED = re.compile(r"<<<DATA id=(\w+)[^>]*>>>.*?<<<END DATA id=\1>>>", re.S)


class RecordingEngine(WrappedEngine):
    """Delegates to a real engine; keeps every request, optionally prepends a leaked secret."""

    def __init__(self, inner: Engine, leak: str | None = None) -> None:
        super().__init__(inner)
        self.leak = leak
        self.requests: list[GenerationRequest] = []

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:  # type: ignore[override]
        self.requests.append(request)
        if self.leak:
            yield TextDelta(f"The config shows {self.leak} as the password. ")
        async for event in self.inner.generate(request):
            if self.leak and not isinstance(event, TextDelta):
                event.text = f"The config shows {self.leak} as the password. " + event.text
            yield event


@pytest.fixture
async def world(tiny_model: Path, tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    fake = corpus_cluster()
    await fake.start()
    kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
    settings = Settings(
        data_dir=tmp_path,
        engine={"backend": "cpu", "model": str(tiny_model), "max_model_len": 2048},
        kubernetes={"enabled": True, "kubeconfig": kubeconfig, "context": "fake-cluster", "timeout_s": 5.0},
        scenarios={n: {"max_tokens": 8} for n in ("chat", "root_cause", "alert_summary", "change_review")},
    )
    log_stream = io.StringIO()
    setup_logging("DEBUG", stream=log_stream)
    db = tmp_path / "opsbot.db"
    store = await Store.open(f"sqlite+aiosqlite:///{db}", StoreSettings(retry={"initial_s": 0.02}))
    engine = RecordingEngine(build_engine(settings, str(tiny_model)))
    await engine.start([ChatMessage("system", DEFAULT_SYSTEM_PROMPT)])
    context = ContextGatherer.from_settings(settings)
    prompts = PromptBuilder(
        engine.tokenizer,
        system_prompt=DEFAULT_SYSTEM_PROMPT,
        max_model_len=2048,
        context_share=0.45,
        history_share=0.2,
    )
    pipeline = Pipeline(
        engine=engine,
        store=store,
        prompts=prompts,
        scenarios=ScenarioRegistry(settings.scenarios),
        context=context,
    )
    out = io.StringIO()
    adapter = ConsoleAdapter(stdin=io.StringIO(""), stdout=out)
    try:
        yield {
            "pipeline": pipeline,
            "engine": engine,
            "store": store,
            "adapter": adapter,
            "out": out,
            "logs": log_stream,
            "db": db,
        }
    finally:
        await context.close()
        await engine.shutdown(5)
        await store.close()
        await fake.stop()
        logging.getLogger().handlers.clear()


def message(text: str, kind: MessageKind, event_id: str, **extra: Any) -> IncomingMessage:
    return IncomingMessage(
        platform="console",
        event_id=event_id,
        channel="incidents",
        user="oncall",
        text=text,
        kind=kind,
        thread_id="T-" + event_id,
        extra=extra,
    )


def stored_text(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        return "\n".join(conn.iterdump())


async def ask_everything(w: dict[str, Any]) -> list[str]:
    """/rca about the leaky pod, an alert carrying the alert corpus, a question pasting secrets."""
    p, adapter = w["pipeline"], w["adapter"]
    await p.handle(
        message(f"why is pod {POD} in namespace corpus crashlooping?", MessageKind.COMMAND, "e1"), adapter
    )
    await p.handle(message("LeakyServiceDown firing", MessageKind.ALERT, "e2", alert=corpus_alert()), adapter)
    pasted = "\n".join(item.text for item in SECRETS[:40])
    await p.handle(message(f"is this config ok?\n{pasted}", MessageKind.MENTION, "e3"), adapter)
    await w["store"].close()  # flush every buffered row to the file before reading it back
    tokenizer = w["engine"].tokenizer
    return [tokenizer.decode(list(r.prompt_token_ids)) for r in w["engine"].requests]


async def test_no_planted_secret_reaches_a_prompt_a_reply_a_row_or_a_log_line(world: dict[str, Any]) -> None:
    prompts = await ask_everything(world)
    assert len(prompts) == 3
    assert POD in prompts[0] and "CrashLoopBackOff" in prompts[0]
    places = {
        "prompt": "\n".join(prompts),
        "reply": world["out"].getvalue(),
        "store": stored_text(world["db"]),
        "log": world["logs"].getvalue(),
    }
    assert places["log"] and places["store"]
    leaks = [
        (where, item.where, item.secret)
        for item in SECRETS
        for where, text in places.items()
        if item.secret in text
    ]
    assert len(SECRETS) >= 200
    assert not leaks, f"{len(leaks)} leaks, first: {leaks[:3]}"


async def test_prompt_injection_strings_appear_only_inside_data_fences(world: dict[str, Any]) -> None:
    prompts = await ask_everything(world)
    assert len(INJECTIONS) >= 50
    seen = 0
    for prompt in prompts:
        outside = _FENCED.sub("", prompt)
        for text in INJECTIONS:
            probe = text[:40]
            seen += probe in prompt
            assert probe not in outside, f"injection outside a fence: {text!r}"
    assert seen > 0  # the corpus did reach the prompts, inside fences


async def test_a_secret_in_the_models_reply_is_redacted_before_it_is_shown_or_stored(
    world: dict[str, Any],
) -> None:
    leaked = "postgres://admin:Sup3rS3cretPassw0rd@db.prod:5432/app"
    world["engine"].leak = leaked
    await world["pipeline"].handle(
        message("what is the db url?", MessageKind.MENTION, "e9"), world["adapter"]
    )
    await world["store"].close()
    assert "Sup3rS3cretPassw0rd" not in world["out"].getvalue()
    assert "Sup3rS3cretPassw0rd" not in stored_text(world["db"])
    assert "Sup3rS3cretPassw0rd" not in world["logs"].getvalue()
    assert "db.prod" in world["out"].getvalue()  # the rest of the reply is kept
