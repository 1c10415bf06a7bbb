"""Status in Mattermost and the SLO guard's warning, through opsbot's own wiring (``bot.app.OpsBot``:
store, CPU engine on the tiny model, SLO guard, Mattermost adapter and HTTP server) against the fake
Mattermost."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fakes.mattermost_server import FakeMattermost
from mm_helpers import ACTION_SECRET, SLASH_TOKEN

from bot.adapters.registry import build_adapters
from bot.app import OpsBot
from bot.config import Settings
from inference.engine import Lane

pytestmark = pytest.mark.timeout(120)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class World:
    def __init__(self, fake: FakeMattermost) -> None:
        self.alice = fake.add_user("alice")
        self.channel = fake.add_channel("incidents", [self.alice, fake.bot_user_id])
        self.ops = fake.add_channel("ops", [fake.bot_user_id])


@pytest.fixture
def world(fake: FakeMattermost) -> World:
    return World(fake)


@pytest.fixture
async def opsbot(
    fake: FakeMattermost, world: World, tiny_model: Path, tmp_path: Path
) -> AsyncIterator[OpsBot]:
    port = free_port()
    settings = Settings(
        data_dir=tmp_path,
        engine={"backend": "cpu", "model": str(tiny_model), "max_model_len": 1024, "drain_timeout_s": 2},
        store={"url": f"sqlite+aiosqlite:///{tmp_path / 'opsbot.db'}"},
        scenarios={
            name: {"max_tokens": 4} for name in ("chat", "root_cause", "change_review", "alert_summary")
        },
        http={"host": "127.0.0.1", "port": port},
        mattermost={
            "enabled": True,
            **fake.settings_kwargs(),
            "slash_command_token": SLASH_TOKEN,
            "action_secret": ACTION_SECRET,
            "public_url": f"http://127.0.0.1:{port}",
            "edit_interval_s": 0.2,
            "retry": {"initial_s": 0.05, "max_s": 0.3},
            "channel_post_interval_s": 0.0,
        },
        slo={
            "ops_channel": f"mattermost:{world.ops}",
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


def command_url(bot: OpsBot) -> str:
    return f"http://127.0.0.1:{bot.http_port}/mattermost/command"


async def until(check: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_rca_status_shows_model_quantization_uptime_queues_kv_reuse_ttft_and_the_slo_state(
    fake: FakeMattermost, world: World, opsbot: OpsBot
) -> None:
    post = await fake.user_posts(world.alice, world.channel, "@opsbot why is checkout failing?")
    await fake.wait_for(lambda: any("request `" in p["message"] for p in fake.thread(post["id"])))
    await until(lambda: opsbot.pipeline is not None and opsbot.pipeline.in_flight == 0)

    status, body, _ = await fake.send_slash_command(
        command_url(opsbot), token=SLASH_TOKEN, user_id=world.alice, channel_id=world.channel, text="status"
    )
    assert status == 200 and body["response_type"] == "ephemeral"
    lines = body["text"].splitlines()
    assert (
        lines[0].startswith("*opsbot status* — engine cpu, model `")
        and "quantization none: ready" in lines[0]
    )
    assert re.search(r", up \d+ (s|min)$", lines[0])
    assert lines[1].startswith("Queue: urgent 0 waiting / 0 running, normal 0 waiting / 0 running")
    assert re.match(
        r"KV cache in use: \d+\.\d %; prefix-cache reuse last hour: 0\.0 % of \d+ prompt tokens", lines[2]
    )
    assert re.match(r"TTFT last hour: p50 \d+\.\d\d s, p99 \d+\.\d\d s \(1 answer\)", lines[3])
    assert lines[4].startswith("SLO: ok")


async def test_a_mention_of_just_status_gets_the_status_in_its_thread_and_no_model_answer(
    fake: FakeMattermost, world: World, opsbot: OpsBot
) -> None:
    post = await fake.user_posts(world.alice, world.channel, "@opsbot status")
    await fake.wait_for(lambda: len(fake.bot_posts(world.channel)) == 1)
    await until(lambda: opsbot.pipeline is not None and opsbot.pipeline.in_flight == 0)
    (reply,) = fake.bot_posts(world.channel)
    assert reply["root_id"] == post["id"] and reply["message"].startswith("*opsbot status*")
    assert "request `" not in reply["message"]  # a status block, not a model answer with its footer
    assert fake.ephemeral == []


async def test_a_breach_posts_one_warning_to_the_ops_channel_and_the_status_shows_it(
    fake: FakeMattermost, world: World, opsbot: OpsBot
) -> None:
    guard = opsbot.slo
    assert guard is not None
    for _ in range(5):  # what the pipeline reports after each slow answer
        guard.observe(Lane.NORMAL, 6.5)
    await fake.wait_for(lambda: len(fake.bot_posts(world.ops)) == 1)
    await until(lambda: guard.level == guard.max_level)
    (warning,) = fake.bot_posts(world.ops)
    assert (
        "opsbot SLO breach" in warning["message"]
        and "normal P99 6.50 s over the 2.00 s target" in warning["message"]
    )

    status, body, _ = await fake.send_slash_command(
        command_url(opsbot), token=SLASH_TOKEN, user_id=world.alice, channel_id=world.channel, text="status"
    )
    assert status == 200
    assert "SLO: BREACHED" in body["text"] and "normal 6.50 s / 2.00 s" in body["text"]
    assert len(fake.bot_posts(world.ops)) == 1
