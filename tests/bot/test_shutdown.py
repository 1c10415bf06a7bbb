"""One owner of work in flight: shutdown drains every platform's answers in one place, with one
deadline, and SIGTERM on a real ``opsbot run`` waits for the answers it is streaming."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
import time
from pathlib import Path

import pytest
from fakes.mattermost_server import FakeMattermost
from fakes.slack_server import FakeSlack

from bot.adapters.mattermost import MattermostAdapter
from bot.adapters.slack import SlackAdapter
from bot.app import OpsBot
from bot.config import Settings

pytestmark = pytest.mark.timeout(180)

LONG = {"max_tokens": 400, "ignore_eos": True}
"""Answers long enough (~2 s on the tiny model) that shutdown meets them mid-stream."""
FOOTER_MARK = "request `"


def settings(tmp_path: Path, model: Path, slack: FakeSlack, mm: FakeMattermost, drain_s: float) -> Settings:
    return Settings(
        data_dir=tmp_path,
        engine={"backend": "cpu", "model": str(model), "max_model_len": 1024, "drain_timeout_s": drain_s},
        scenarios=dict.fromkeys(("chat", "root_cause", "change_review", "alert_summary"), LONG),
        http={"enabled": False},
        slack={
            "enabled": True,
            "bot_token": slack.bot_token,
            "app_token": slack.app_token,
            "api_base_url": slack.api_url,
            "channel_post_interval_s": 0,
            "edit_interval_s": 0.2,
        },
        mattermost={
            "enabled": True,
            **mm.settings_kwargs(),
            "edit_interval_s": 0.2,
            "channel_post_interval_s": 0,
        },
    )


async def test_shutdown_lets_every_platforms_answers_in_flight_finish(
    tiny_model: Path, tmp_path: Path
) -> None:
    async with FakeSlack() as slack, FakeMattermost() as mm:
        s = settings(tmp_path, tiny_model, slack, mm, drain_s=60)
        bot = OpsBot(s)
        await bot.start_core()
        assert bot.store is not None
        await bot.start_service(
            [SlackAdapter(s.slack, bot.store), MattermostAdapter(s.mattermost, bot.store)]
        )
        alice = mm.add_user("alice")
        channel = mm.add_channel("incidents", [alice, mm.bot_user_id])
        await slack.deliver_event(slack.user_message("D1", "U1", "why is checkout slow?", channel_type="im"))
        post = await mm.user_posts(alice, channel, "@opsbot why is checkout slow?")
        assert bot.pipeline is not None
        await slack.wait_for(lambda: bool(slack.bot_messages("D1")))
        await mm.wait_for(lambda: any(p["root_id"] == post["id"] for p in mm.bot_posts()))
        assert bot.pipeline.in_flight == 2  # both answers are still streaming
        await bot.shutdown()
    slack_final = slack.bot_messages("D1")[-1]
    assert any(b.get("type") == "context" for b in (slack_final.blocks or [])), "Slack answer unfinished"
    assert [p for p in mm.bot_posts() if p["root_id"] == post["id"] and FOOTER_MARK in p["message"]]
    with sqlite3.connect(tmp_path / "opsbot.db") as db:
        statuses = sorted(row[0] for row in db.execute("SELECT status FROM opsbot_requests"))
    assert statuses == ["ok", "ok"]


async def test_sigterm_on_opsbot_run_waits_for_the_answer_it_is_streaming(
    tiny_model: Path, tmp_path: Path
) -> None:
    async with FakeMattermost() as mm:
        alice = mm.add_user("alice")
        channel = mm.add_channel("incidents", [alice, mm.bot_user_id])
        env = {
            **os.environ,
            "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
            "OPSBOT_CONFIG": "",
            "OPSBOT_DATA_DIR": str(tmp_path),
            "OPSBOT_HTTP__ENABLED": "false",
            "OPSBOT_ENGINE__BACKEND": "cpu",
            "OPSBOT_ENGINE__MODEL": str(tiny_model),
            "OPSBOT_ENGINE__MAX_MODEL_LEN": "1024",
            "OPSBOT_ENGINE__DRAIN_TIMEOUT_S": "60",
            "OPSBOT_SCENARIOS": '{"chat": {"max_tokens": 400, "ignore_eos": true}}',
            "OPSBOT_MATTERMOST__ENABLED": "true",
            "OPSBOT_MATTERMOST__URL": mm.host,
            "OPSBOT_MATTERMOST__SCHEME": "http",
            "OPSBOT_MATTERMOST__PORT": str(mm.port),
            "OPSBOT_MATTERMOST__TOKEN": mm.tokens_for(mm.bot_user_id),
            "OPSBOT_MATTERMOST__EDIT_INTERVAL_S": "0.2",
        }
        env.pop("OPSBOT_CONFIG")
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bot.cli",
            "run",
            env=env,
            cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            await mm.wait_for(lambda: mm.live_connections() > 0, timeout=60)
            post = await mm.user_posts(alice, channel, "@opsbot hello, how are things?")
            await mm.wait_for(lambda: any(p["root_id"] == post["id"] for p in mm.bot_posts()), timeout=30)
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            output, _ = await asyncio.wait_for(proc.communicate(), 60)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        log = output.decode(errors="replace")
        assert proc.returncode == 0, log[-3000:]
        final = [p for p in mm.bot_posts() if p["root_id"] == post["id"] and FOOTER_MARK in p["message"]]
        assert final, f"the answer in flight at SIGTERM was not finished; log:\n{log[-3000:]}"
        assert time.monotonic() - sent < 60
        assert "waiting up to 60 s for 1 answer(s) in flight" in log
    with sqlite3.connect(tmp_path / "opsbot.db") as db:
        assert [r[0] for r in db.execute("SELECT status FROM opsbot_requests")] == ["ok"]
