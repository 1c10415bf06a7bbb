"""The whole flow on the ``openai`` backend: console adapter -> pipeline -> remote server -> store row.

The server is the fake vLLM 0.26 server (``tests/fakes/openai_server.py``, its own thread, real
HTTP); the engine is built by ``bot.engine_factory`` from settings, as ``opsbot run`` builds it,
and its tokenizer is the server's own (``/tokenize``), so the prompt builder's counts and renders
go over HTTP too. The request row must carry the remote engine's timings and the server's counts.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fakes.openai_server import FakeOpenAIServer
from rich.emoji import Emoji
from sqlalchemy import select

from bot.adapters.console import ConsoleAdapter
from bot.app import submit_to
from bot.config import Settings, StoreSettings
from bot.engine_factory import build_engine, resolve_model
from bot.pipeline import ENGINE_DEAD_TEXT, Pipeline
from bot.prompts import DEFAULT_SYSTEM_PROMPT, PromptBuilder
from bot.store import RequestRecord, Store
from bot.store.models import RequestRow
from inference.engine import ChatMessage, Engine
from inference.scenarios import ScenarioRegistry

MODEL = "tiny-chat"


@dataclass
class Remote:
    pipeline: Pipeline
    engine: Engine
    store: Store
    adapter: ConsoleAdapter
    out: io.StringIO
    server: FakeOpenAIServer


@pytest.fixture
def server(tiny_model: Path) -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(tiny_model, served_model_name=MODEL, max_model_len=2048) as srv:
        yield srv


@pytest.fixture
async def remote(server: FakeOpenAIServer, tmp_path: Path) -> AsyncIterator[Remote]:
    settings = Settings(
        data_dir=tmp_path,
        engine={
            "backend": "openai",
            "base_url": server.url,
            "served_model_name": MODEL,
            "max_model_len": 2048,
            "health_interval_s": 0.05,
        },
        scenarios={
            name: {"max_tokens": 12} for name in ("chat", "root_cause", "alert_summary", "change_review")
        },
    )
    db_url = f"sqlite+aiosqlite:///{tmp_path / 'opsbot.db'}"
    store = await Store.open(db_url, StoreSettings(retry={"initial_s": 0.02, "max_s": 0.2}))
    model = resolve_model(settings)
    assert model == MODEL and not (tmp_path / "models").exists()  # no test model is built for a server
    engine = build_engine(settings, model)
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
        model_name=model,
    )
    out = io.StringIO()
    adapter = ConsoleAdapter(stdin=io.StringIO(""), stdout=out)
    await adapter.start(submit_to(pipeline, adapter))
    try:
        yield Remote(pipeline, engine, store, adapter, out, server)
    finally:
        await engine.shutdown(5)
        await store.close()


async def stored_row(store: Store, request_id: str) -> RequestRecord:
    for _ in range(200):
        async with store.engine.connect() as conn:
            row = (await conn.execute(select(RequestRow).where(RequestRow.request_id == request_id))).first()
        if row is not None:
            columns = [name for name in RequestRecord.__dataclass_fields__ if name != "steps"]  # own table
            return RequestRecord(**{name: getattr(row, name) for name in columns})
        await asyncio.sleep(0.05)
    raise AssertionError(f"no request row for {request_id}")


async def test_a_question_streams_from_the_remote_server_and_its_row_carries_the_remote_timings(
    remote: Remote,
) -> None:
    message = remote.adapter.to_message("/rca why is checkout-api crashlooping?")
    await remote.adapter._submit(message)  # type: ignore[misc]
    printed = remote.out.getvalue()
    assert "first token" in printed and "ms/token" in printed
    row = await stored_row(remote.store, message.request_id)
    (received,) = remote.server.requests_for(message.request_id)
    assert row.status == "ok" and row.model == MODEL and row.lane == "urgent"
    # Token ids rendered by the bot (through the server's /tokenize) went to /v1/completions.
    assert received.path == "/v1/completions" and received.body["priority"] == 0
    assert row.prompt_tokens == received.prompt_tokens == len(received.body["prompt"])
    assert row.output_tokens == received.tokens_sent == 12
    # The warm-up put the shared system prompt's full KV blocks into the server's prefix cache.
    system_tokens = len(remote.engine.tokenizer.render([ChatMessage("system", DEFAULT_SYSTEM_PROMPT)], False))
    assert row.cached_tokens == received.cached_tokens >= system_tokens // 16 * 16 > 0
    assert row.ttft_ms is not None and row.tpot_ms is not None and row.e2e_ms is not None
    assert row.queue_ms is not None and 0 <= row.queue_ms <= row.ttft_ms <= row.e2e_ms


async def test_a_dead_server_is_reported_in_the_thread_and_recorded(remote: Remote) -> None:
    remote.server.crash()
    message = remote.adapter.to_message("is anything wrong?")
    await remote.adapter._submit(message)  # type: ignore[misc]
    assert Emoji.replace(ENGINE_DEAD_TEXT) in remote.out.getvalue()  # the terminal shows :warning: as ⚠
    row = await stored_row(remote.store, message.request_id)
    assert row.status == "engine_dead" and "unreachable" in (row.error or "")
