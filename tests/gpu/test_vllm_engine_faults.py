"""The vLLM engine dies mid-stream on the H200: the engine-core process is killed (SIGKILL) while four
answers stream through a real ``opsbot run`` on fake Mattermost. Every thread gets the engine-down
note, ``/readyz`` answers 503, and the engine restarts in-process (``engine.on_dead = restart``):
a question after that is answered again.

Run on the H200:
``PYTHONPATH=$PWD python -m pytest -q -p no:cacheprovider tests/gpu/test_vllm_engine_faults.py -s``
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import aiohttp
from fakes.mattermost_server import FakeMattermost
from reliability.botproc import BotProcess, base_env
from reliability.helpers import poll

from bot.pipeline import ENGINE_DEAD_TEXT

FOOTER_MARK = "request `"
STREAMS = 4


def descendants(pid: int) -> dict[int, str]:
    """Every descendant of ``pid`` with its command line (from /proc)."""
    found: dict[int, str] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in found:
                continue
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                comm = (entry / "comm").read_text().strip()
            except (OSError, IndexError, ValueError):
                continue
            if ppid == parent:
                found[int(entry.name)] = f"{comm} {cmdline}"
                frontier.append(int(entry.name))
    return found


async def test_killing_the_vllm_engine_core_mid_stream_notes_every_thread_and_the_engine_restarts(
    tiny_model: Path, tmp_path: Path
) -> None:
    async with FakeMattermost(rate_limit=None) as mm:
        alice = mm.add_user("alice")
        channel = mm.add_channel("incidents", [alice, mm.bot_user_id])
        env = base_env(tmp_path, tiny_model, {"chat": {"max_tokens": 900, "ignore_eos": True}})
        env.update(
            {
                "OPSBOT_ENGINE__BACKEND": "vllm",
                "OPSBOT_ENGINE__GPU_MEMORY_UTILIZATION": "0.2",
                "OPSBOT_ENGINE__MAX_MODEL_LEN": "1024",
                "OPSBOT_ENGINE__ENFORCE_EAGER": "true",
                "OPSBOT_ENGINE__INCIDENT_WARMUP": "false",
                "OPSBOT_ENGINE__ON_DEAD": "restart",
                "OPSBOT_MATTERMOST__ENABLED": "true",
                "OPSBOT_MATTERMOST__URL": mm.host,
                "OPSBOT_MATTERMOST__SCHEME": "http",
                "OPSBOT_MATTERMOST__PORT": str(mm.port),
                "OPSBOT_MATTERMOST__TOKEN": mm.tokens_for(mm.bot_user_id),
                "OPSBOT_MATTERMOST__EDIT_INTERVAL_S": "0.2",
                "OPSBOT_MATTERMOST__CHANNEL_POST_INTERVAL_S": "0",
            }
        )
        bot = BotProcess("vllm", tmp_path, env)
        await bot.start()
        try:
            await bot.wait_ready(timeout_s=600)
            await poll(lambda: mm.live_connections() > 0, timeout_s=60, what="the websocket")
            posts = [await mm.user_posts(alice, channel, f"@opsbot hello {i}") for i in range(STREAMS)]

            def replies(post: dict) -> list[str]:
                return [p["message"] for p in mm.bot_posts() if p["root_id"] == post["id"]]

            def streaming(post: dict) -> bool:
                texts = replies(post)
                return bool(texts) and len(texts[0]) > 40 and FOOTER_MARK not in texts[0]

            await poll(lambda: all(streaming(p) for p in posts), timeout_s=120, what="4 answers streaming")
            assert bot.proc is not None
            cores = {pid: cmd for pid, cmd in descendants(bot.proc.pid).items() if "EngineCore" in cmd}
            assert cores, f"no vLLM engine-core process among {descendants(bot.proc.pid)}"
            for pid in cores:
                os.kill(pid, signal.SIGKILL)
            killed_at = time.monotonic()
            statuses: list[int] = []

            async def watch() -> None:
                async with aiohttp.ClientSession() as session:
                    while True:
                        with contextlib.suppress(aiohttp.ClientError):  # restarting: refused
                            async with session.get(f"{bot.url}/readyz") as response:
                                statuses.append(response.status)
                        await asyncio.sleep(0.05)

            watcher = asyncio.create_task(watch())
            try:
                await poll(
                    lambda: all(ENGINE_DEAD_TEXT in " ".join(replies(p)) for p in posts),
                    timeout_s=30,
                    what="the engine-down note in every thread",
                )
                noted_s = time.monotonic() - killed_at
                await poll(lambda: 503 in statuses, timeout_s=30, what="/readyz 503")
                await bot.wait_ready(timeout_s=600)
            finally:
                watcher.cancel()
            print(f"engine core killed: {STREAMS} threads noted after {noted_s:.2f} s; restarted")
            after = await mm.user_posts(alice, channel, "@opsbot are you back?")
            await poll(lambda: any(FOOTER_MARK in t for t in replies(after)), timeout_s=120, what="an answer")
        finally:
            await bot.stop()
