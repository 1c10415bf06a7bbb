"""``POST /analyze`` inside a running bot: the real pipeline on the CPU engine, a SQLite store and
opsbot's HTTP server. A batch runs in the background lane while urgent ``/rca`` questions are
answered ahead of it; a stopped job resumes where it stopped."""

from __future__ import annotations

import asyncio
import io
import json
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from sqlalchemy import select

from bot.adapters.console import ConsoleAdapter
from bot.analyze.service import AnalyzeService
from bot.app import submit_to
from bot.config import Settings
from bot.engine_factory import build_engine
from bot.http import build_http_app, start_http
from bot.pipeline import Pipeline
from bot.prompts import DEFAULT_SYSTEM_PROMPT, PromptBuilder
from bot.store import Store
from bot.store.models import RequestRow
from inference.engine import ChatMessage
from inference.scenarios import ScenarioRegistry

TOKEN = "analyze-s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@dataclass
class Bot:
    settings: Settings
    store: Store
    pipeline: Pipeline
    adapter: ConsoleAdapter
    service: AnalyzeService
    url: str


@pytest.fixture
async def bot(tiny_model: Path, tmp_path: Path) -> AsyncIterator[Bot]:
    """Store -> CPU engine (2 workers) -> pipeline -> the analyze service on opsbot's HTTP server."""
    settings = Settings(
        data_dir=tmp_path,
        engine={"backend": "cpu", "model": str(tiny_model), "max_model_len": 2048, "cpu_max_concurrency": 2},
        scenarios=dict.fromkeys(("chat", "root_cause", "alert_summary", "change_review"), {"max_tokens": 12}),
        analyze={"enabled": True, "bearer_token": TOKEN, "max_in_flight": 6},
    )
    store = await Store.open(settings.store_url, settings.store)
    engine = build_engine(settings, str(tiny_model))
    await engine.start([ChatMessage("system", DEFAULT_SYSTEM_PROMPT)])
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
        model_name=str(tiny_model),
    )
    adapter = ConsoleAdapter(stdin=io.StringIO(""), stdout=io.StringIO())
    await adapter.start(submit_to(pipeline, adapter))
    service = AnalyzeService(settings, pipeline, store, {"console": adapter}, model=str(tiny_model))
    runner, port = await start_http(
        build_http_app(engine=engine, store=store, routes=service.http_routes()), "127.0.0.1", 0
    )
    try:
        yield Bot(settings, store, pipeline, adapter, service, f"http://127.0.0.1:{port}")
    finally:
        service.stop()
        await pipeline.drain(10)
        await runner.cleanup()
        await engine.shutdown(5)
        await store.close()


def alerts_jsonl(groups: int) -> bytes:
    lines = [
        json.dumps(
            {
                "labels": {
                    "alertname": f"Alert{i:02d}",
                    "namespace": "payments",
                    "pod": f"api-7d9f8b6c4-x2x9{i % 5}",
                },
                "annotations": {"summary": f"alert {i} fires"},
                "startsAt": f"2026-11-30T{8 + i % 8:02d}:00:00Z",
                "status": "firing",
            }
        )
        for i in range(groups)
    ]
    lines.insert(2, "this line is not json")
    return ("\n".join(lines) + "\n").encode()


async def wait_for(session: aiohttp.ClientSession, url: str, done, timeout_s: float = 240.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        async with session.get(url, headers=AUTH) as response:
            state = await response.json()
        if done(state):
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"analysis did not get there in time: {state}")
        await asyncio.sleep(0.1)


async def request_rows(store: Store) -> list[RequestRow]:
    deadline = time.monotonic() + 20
    while store.buffered:
        assert time.monotonic() < deadline, "store buffer not flushed"
        await asyncio.sleep(0.05)
    async with store.engine.connect() as conn:
        return list((await conn.execute(select(RequestRow))).all())


async def test_bad_requests_get_a_clear_answer_and_no_job(bot: Bot) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{bot.url}/analyze", data=alerts_jsonl(3)) as response:
            assert response.status == 401
        async with session.post(f"{bot.url}/analyze?scenario=poetry", data=b"{}", headers=AUTH) as response:
            assert response.status == 400 and "unknown scenario" in (await response.json())["error"]
        async with session.post(f"{bot.url}/analyze", data=b"   ", headers=AUTH) as response:
            assert response.status == 400 and "empty" in (await response.json())["error"]
        async with session.post(
            f"{bot.url}/analyze?format=jsonl", data=b"not json\n{\n", headers=AUTH
        ) as response:
            body = await response.json()
            assert response.status == 400 and body["error"] == "no records could be read"
            assert body["bad_lines"][0].startswith("upload line 1: not JSON")
        async with session.post(
            f"{bot.url}/analyze?post=slack:C1", data=alerts_jsonl(2), headers=AUTH
        ) as response:
            assert response.status == 400 and "no slack adapter" in (await response.json())["error"]
    assert bot.service.jobs == {}


async def test_urgent_answers_go_ahead_of_a_batch_running_in_the_background_lane(bot: Bot) -> None:
    groups = 24
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{bot.url}/analyze?scenario=alert_summary&max_tokens=16&name=shift.jsonl",
            data=alerts_jsonl(groups),
            headers=AUTH,
        ) as response:
            assert response.status == 202
            accepted = await response.json()
        assert accepted["records"] == groups and accepted["bad_lines"] == 1
        assert accepted["bad_line_list"] == ["shift.jsonl line 3: not JSON (Expecting value at column 1)"]
        status_url = f"{bot.url}{accepted['status_url']}"
        await wait_for(session, status_url, lambda s: s["items_done"] >= 2)

        # Three /rca questions while the batch holds the engine: each is answered in the urgent lane.
        for question in (
            "why is payments-api failing?",
            "why are checkout pods restarting?",
            "what broke the db?",
        ):
            await bot.pipeline.submit(bot.adapter.to_message(f"/rca {question}"), bot.adapter)
        mid = await wait_for(session, status_url, lambda s: True)
        assert mid["status"] == "running" and mid["items_done"] < groups  # the batch was still running

        final = await wait_for(session, status_url, lambda s: s["status"] != "running")
        assert final["status"] == "done", final
        assert final["items_done"] == groups and final["report"]["totals"]["summarised"] == groups
        async with session.get(f"{status_url}/report.md", headers=AUTH) as response:
            assert response.status == 200 and "## Summaries" in await response.text()
        async with session.get(f"{status_url}/counts.png", headers=AUTH) as response:
            assert response.status == 200 and response.content_type == "image/png"
            assert (await response.read()).startswith(b"\x89PNG")

    rows = await request_rows(bot.store)
    batch = [r for r in rows if r.scenario == "batch"]
    urgent = [r for r in rows if r.lane == "urgent"]
    assert len(batch) == groups and {(r.lane, r.status, r.platform) for r in batch} == {
        ("background", "ok", "analyze")
    }
    assert len(urgent) == 3 and all(r.status == "ok" for r in urgent)
    # An urgent question waits at most for one batch item to leave a worker (the CPU engine serves
    # urgent work first and admission admits it at once), while batch items queue behind each other.
    service_ms = [r.e2e_ms - r.queue_ms for r in batch]
    assert max(r.queue_ms for r in urgent) <= max(service_ms)
    # The typical urgent question waits less than the typical batch item (the median: on a loaded CI
    # machine one urgent question can wait a whole slow item, 276 ms once against a batch median of
    # 153 ms, while the bound above still held).
    assert statistics.median(r.queue_ms for r in urgent) < statistics.median(r.queue_ms for r in batch)


async def test_a_job_stopped_by_shutdown_keeps_its_items_and_the_same_post_resumes_it(bot: Bot) -> None:
    body = alerts_jsonl(10)
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{bot.url}/analyze?max_tokens=16", data=body, headers=AUTH) as response:
            job = (await response.json())["job"]
        status_url = f"{bot.url}/analyze/{job}"
        await wait_for(session, status_url, lambda s: s["items_done"] >= 2)
        bot.service.stop()  # what shutdown does first
        stopped = await wait_for(session, status_url, lambda s: s["status"] != "running")
        assert stopped["status"] == "interrupted" and 2 <= stopped["items_done"] < 10
        kept = stopped["report"]["totals"]["summarised"]

        bot.service.accepting = True  # as after a restart
        async with session.post(f"{bot.url}/analyze?max_tokens=16", data=body, headers=AUTH) as response:
            assert response.status == 202 and (await response.json())["job"] == job
        final = await wait_for(session, status_url, lambda s: s["status"] != "running")
    assert final["status"] == "done"
    assert final["report"]["run"]["skipped_already_done"] == kept
    assert final["report"]["totals"]["summarised"] == 10
