"""Status in Slack and the SLO guard's warning, through opsbot's own wiring (``bot.app.OpsBot``:
store, CPU engine on the tiny model, SLO guard, Slack adapter) against the fake Slack."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fakes.slack_harness import SHORT, answers, slack_settings
from fakes.slack_server import FakeSlack

from bot.adapters.registry import build_adapters
from bot.app import OpsBot
from bot.config import Settings
from inference.engine import Lane

pytestmark = pytest.mark.timeout(120)
OPS = "C0OPS"


@pytest.fixture
async def opsbot(slack: FakeSlack, tiny_model: Path, tmp_path: Path) -> AsyncIterator[OpsBot]:
    settings = Settings(
        data_dir=tmp_path,
        engine={"backend": "cpu", "model": str(tiny_model), "max_model_len": 1024, "drain_timeout_s": 2},
        store={"url": f"sqlite+aiosqlite:///{tmp_path / 'opsbot.db'}"},
        scenarios=dict.fromkeys(("chat", "root_cause", "change_review", "alert_summary"), SHORT),
        http={"enabled": False},
        slack=slack_settings(slack).model_dump(mode="python"),
        slo={
            "ops_channel": f"slack:{OPS}",
            "evaluate_interval_s": 0.05,
            "step_interval_s": 0.2,
            "min_samples": 3,
        },
    )
    bot = OpsBot(settings)
    await bot.start_core()
    assert bot.store is not None
    await bot.start_service(build_adapters(settings, bot.store))
    try:
        yield bot
    finally:
        await bot.shutdown()


async def until(check: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def command_notice(slack: FakeSlack, text: str) -> str:
    """What ``/rca TEXT`` tells the person who typed it: on the command's ack when the pipeline's
    answer came in time, else as an ephemeral message."""
    env = await slack.deliver("slash_commands", slack.slash_command("C1", "U7", text))
    await slack.wait_for(lambda: env.acked_at is not None)
    if (env.ack_payload or {}).get("text"):
        return str(env.ack_payload["text"])  # type: ignore[index]
    await slack.wait_for(lambda: len(slack.ephemerals) == 1)
    return str(slack.ephemerals[0]["text"])


async def test_rca_status_shows_model_quantization_uptime_queues_kv_reuse_ttft_and_the_slo_state(
    slack: FakeSlack, opsbot: OpsBot
) -> None:
    event = slack.user_message("C1", "U1", f"<@{slack.bot_user_id}> why is checkout returning 502?")
    await slack.deliver_event(slack.mention_events(event)[0])
    await slack.wait_for(lambda: len(answers(slack, "C1")) == 1)
    assert opsbot.pipeline is not None
    await until(lambda: opsbot.pipeline is not None and opsbot.pipeline.in_flight == 0)

    text = await command_notice(slack, "status")
    lines = text.splitlines()
    assert lines[0].startswith("*opsbot status* — engine cpu, model `")
    assert "quantization none: ready, up " in lines[0]
    assert re.search(r"up \d+ s$", lines[0])
    assert lines[1] == (
        "Queue: urgent 0 waiting / 0 running, normal 0 waiting / 0 running, background 0 waiting / 0 running"
    )
    assert re.match(
        r"KV cache in use: \d+\.\d %; prefix-cache reuse last hour: 0\.0 % of \d+ prompt tokens", lines[2]
    )
    assert re.match(r"TTFT last hour: p50 \d+\.\d\d s, p99 \d+\.\d\d s \(1 answer\)", lines[3])
    assert lines[4].startswith("SLO: ok — P99 TTFT over 120 s vs target: urgent n/a / 2.00 s")
    assert lines[5].startswith("Store: up")


async def test_a_mention_of_just_status_gets_the_status_in_its_thread_and_no_model_answer(
    slack: FakeSlack, opsbot: OpsBot
) -> None:
    event = slack.user_message("C1", "U1", f"<@{slack.bot_user_id}>  Status ")
    for e in slack.mention_events(event):
        await slack.deliver_event(e)
    await slack.wait_for(lambda: len(slack.bot_messages("C1")) == 1)
    await until(lambda: opsbot.pipeline is not None and opsbot.pipeline.in_flight == 0)
    (reply,) = slack.bot_messages("C1")
    assert reply.thread_ts == event["ts"] and reply.text.startswith("*opsbot status*")
    assert "SLO: ok" in reply.text
    assert answers(slack) == [] and slack.ephemerals == []
    assert opsbot.store is not None
    assert await opsbot.store.requests_between(reply_time_floor()) == []  # the model was not asked


def reply_time_floor() -> Any:
    from datetime import UTC, datetime, timedelta

    return datetime.now(UTC) - timedelta(hours=1)


async def test_a_breach_posts_one_warning_to_the_ops_channel_and_the_status_shows_it(
    slack: FakeSlack, opsbot: OpsBot
) -> None:
    guard = opsbot.slo
    assert guard is not None
    for _ in range(5):  # what the pipeline reports after each slow answer
        guard.observe(Lane.URGENT, 4.0)
    await slack.wait_for(lambda: len(slack.bot_messages(OPS)) == 1)
    await until(lambda: guard.level == guard.max_level)  # the breach held: every step taken
    (warning,) = slack.bot_messages(OPS)
    assert (
        "opsbot SLO breach" in warning.text
        and "urgent P99 4.00 s over the 2.00 s target (5 answers)" in warning.text
    )
    assert warning.thread_ts is None

    status = await command_notice(slack, "status")
    assert "SLO: BREACHED" in status and "urgent 4.00 s / 2.00 s" in status
    assert f"guard step {guard.max_level}/{guard.max_level}: background lane held to 4 in flight" in status
    assert len(slack.bot_messages(OPS)) == 1
