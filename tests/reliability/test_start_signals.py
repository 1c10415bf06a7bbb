"""SIGTERM during start-up: a real ``opsbot run`` stops cleanly (exit 0), whenever the signal lands.

A deploy that rolls on, or a supervisor stopping a slow start, signals the bot while its engine
loads or its HTTP server and platforms come up. Before the fix the SIGTERM handler was installed
only once start-up was done, so such a signal killed the bot by the default action (exit 143 under
the supervisor, the engine's processes left to its clean-up); the GPU test
``test_no_vllm_process_outlives_the_bot[sigterm]`` met it on the H200.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from reliability.botproc import BotProcess, base_env

pytestmark = [pytest.mark.timeout(120)]


async def _wait_for_line(bot: BotProcess, marker: str, timeout_s: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while marker not in bot.log():
        assert bot.proc is not None
        if bot.proc.returncode is not None:
            raise AssertionError(f"exited {bot.proc.returncode} before {marker!r}:\n{bot.log()[-3000:]}")
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"no {marker!r} after {timeout_s} s:\n{bot.log()[-3000:]}")
        await asyncio.sleep(0.01)


@pytest.mark.parametrize(
    "moment",
    [
        "loading the cpu engine",  # the engine is loading: start_core has not returned
        "serving HTTP only",  # start_core is done, the HTTP server is about to start
    ],
)
async def test_sigterm_during_start_up_stops_the_bot_cleanly(
    moment: str, tiny_model: Path, tmp_path: Path
) -> None:
    bot = BotProcess("start", tmp_path, base_env(tmp_path, tiny_model, {}))
    await bot.start()
    try:
        await _wait_for_line(bot, moment)
        bot.terminate()
        code = await bot.wait(60)
    finally:
        await bot.stop()
    assert code == 0, (
        f"SIGTERM at {moment!r} ended the bot with {code}, not a clean stop:\n{bot.log()[-3000:]}"
    )
    assert "Traceback" not in bot.log(), bot.log()[-3000:]
    # the store was closed properly: the database opens and holds its schema
    with sqlite3.connect(tmp_path / "opsbot.db") as db:
        assert db.execute("select count(*) from opsbot_requests").fetchone() == (0,)
