"""Graceful shutdown under load: SIGTERM to a real ``opsbot run`` while 50 answers stream.

Every answer either finishes within the drain deadline (``engine.drain_timeout_s``) or ends with
the shutdown note in its thread; all 50 request rows are written before the process exits 0.
(tests/bot/test_shutdown.py covers one answer per platform finishing in time.)
"""

from __future__ import annotations

import signal
import sqlite3
import time
from pathlib import Path

import pytest
from fakes.mattermost_server import FakeMattermost

from bot.pipeline import SHUTDOWN_TEXT
from reliability.botproc import BotProcess, base_env
from reliability.helpers import poll

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ANSWERS = 50
QUESTIONS = ("hello, how are things?", "why is checkout failing?")
DRAIN_S = 15.0
FOOTER_MARK = "request `"
SCENARIOS = {
    # half the questions are short enough to finish inside the drain, the "why" half is not
    "chat": {"max_tokens": 80, "ignore_eos": True},
    "root_cause": {"max_tokens": 3000, "ignore_eos": True},
}


async def test_sigterm_during_50_streaming_answers_finishes_or_notes_each_and_keeps_every_row(
    tiny_model: Path, tmp_path: Path
) -> None:
    async with FakeMattermost(rate_limit=None) as mm:
        alice = mm.add_user("alice")
        channels = [mm.add_channel(f"inc-{i}", [alice, mm.bot_user_id]) for i in range(5)]
        env = base_env(tmp_path, tiny_model, SCENARIOS)
        env.update(
            {
                "OPSBOT_ENGINE__DRAIN_TIMEOUT_S": str(DRAIN_S),
                "OPSBOT_ENGINE__CPU_MAX_CONCURRENCY": str(ANSWERS),
                "OPSBOT_ENGINE__CPU_THREADS": "1",
                "OPSBOT_MATTERMOST__ENABLED": "true",
                "OPSBOT_MATTERMOST__URL": mm.host,
                "OPSBOT_MATTERMOST__SCHEME": "http",
                "OPSBOT_MATTERMOST__PORT": str(mm.port),
                "OPSBOT_MATTERMOST__TOKEN": mm.tokens_for(mm.bot_user_id),
                "OPSBOT_MATTERMOST__EDIT_INTERVAL_S": "0.5",
                "OPSBOT_MATTERMOST__CHANNEL_POST_INTERVAL_S": "0",
                "OPSBOT_MATTERMOST__RATE_BUDGETS": "false",
            }
        )
        bot = BotProcess("drain", tmp_path, env)
        await bot.start()
        try:
            await bot.wait_ready()
            await poll(lambda: mm.live_connections() > 0, what="the websocket")
            posts = [
                await mm.user_posts(alice, channels[i % len(channels)], f"@opsbot {QUESTIONS[i % 2]} ({i})")
                for i in range(ANSWERS)
            ]

            def replies(post: dict) -> list[str]:
                return [p["message"] for p in mm.bot_posts() if p["root_id"] == post["id"]]

            def streaming(post: dict) -> bool:
                texts = replies(post)
                return bool(texts) and len(texts[0]) > 20 and FOOTER_MARK not in texts[0]

            def started(post: dict) -> bool:
                texts = replies(post)
                return bool(texts) and len(texts[0]) > 20

            # Every answer has begun streaming; the short ones may be done, the long ones are not.
            await poll(lambda: all(started(p) for p in posts), timeout_s=120, what="50 answers streaming")
            at_signal = sum(streaming(p) for p in posts)
            done_before = ANSWERS - at_signal
            bot.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            sent = time.monotonic()
            code = await bot.wait(90)
            took = time.monotonic() - sent
        finally:
            await bot.stop()
        log = bot.log()
        assert code == 0, log[-3000:]
        finished = [p for p in posts if any(FOOTER_MARK in t for t in replies(p))]
        noted = [p for p in posts if any(t == SHUTDOWN_TEXT for t in replies(p))]
        print(
            f"SIGTERM with {at_signal} answers streaming ({done_before} already done): "
            f"{len(finished) - done_before} finished within the {DRAIN_S:g} s drain, {len(noted)} ended "
            f"with the shutdown note; exit after {took:.1f} s"
        )
        assert sorted(p["id"] for p in finished + noted) == sorted(p["id"] for p in posts)
        assert not {p["id"] for p in finished} & {p["id"] for p in noted}
        assert noted and at_signal >= ANSWERS // 2  # the deadline really cut answers in flight
        assert f"waiting up to {DRAIN_S:.0f} s for {ANSWERS} answer(s) in flight" in log
    with sqlite3.connect(tmp_path / "opsbot.db") as db:
        statuses = [r[0] for r in db.execute("SELECT status FROM opsbot_requests")]
    assert len(statuses) == ANSWERS
    assert statuses.count("ok") == len(finished) and statuses.count("aborted") == len(noted)
