"""Alert storms: many Alertmanager groups for one channel within a minute are coalesced into one
storm thread with a line per group and one analysis, instead of a thread and an analysis each."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import aiohttp
import pytest
from fakes.mattermost_server import FakeMattermost

from bot.adapters.mattermost import MattermostAdapter
from bot.app import OpsBot
from bot.config import Settings
from reliability.helpers import alert_payload, poll

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

FOOTER_MARK = "request `"
GROUPS = 20
THRESHOLD = 3


async def test_twenty_groups_in_a_burst_get_three_threads_and_one_storm_thread_with_one_analysis(
    tiny_model: Path, tmp_path: Path
) -> None:
    async with FakeMattermost(rate_limit=None) as mm:
        alice = mm.add_user("alice")
        channel = mm.add_channel("alerts", [alice, mm.bot_user_id])
        s = Settings(
            data_dir=tmp_path,
            engine={"backend": "cpu", "model": str(tiny_model), "max_model_len": 2048},
            scenarios={"alert_summary": {"max_tokens": 8}},
            http={"enabled": True, "host": "127.0.0.1", "port": 0},
            slo={"enabled": False},
            alertmanager={
                "enabled": True,
                "targets": [f"mattermost:{channel}"],
                "storm_threshold": THRESHOLD,
                "storm_window_s": 60,
                "storm_settle_s": 1.0,
            },
            mattermost={"enabled": True, **mm.settings_kwargs(), "channel_post_interval_s": 0},
        )
        bot = OpsBot(s)
        await bot.start_core()
        assert bot.store is not None
        try:
            await bot.start_service([MattermostAdapter(s.mattermost, bot.store)])
            url = f"http://127.0.0.1:{bot.http_port}/alertmanager"
            names = [f"Alert{i:02d}" for i in range(GROUPS)]
            async with aiohttp.ClientSession() as session:
                for i, name in enumerate(names):
                    payload = alert_payload("firing", (f"fp{i}",), group=f"g{i}", name=name)
                    async with session.post(url, json=payload) as response:
                        assert response.status == 200

                def roots() -> list[dict]:
                    return [p for p in mm.bot_posts(channel) if not p["root_id"]]

                def storm_root() -> list[dict]:
                    return [p for p in roots() if "Alert storm" in p["message"]]

                def finals(root: str) -> list[dict]:
                    return [p for p in mm.bot_posts() if p["root_id"] == root and FOOTER_MARK in p["message"]]

                def lines(root: str) -> list[dict]:
                    return [
                        p for p in mm.bot_posts() if p["root_id"] == root and p["message"].startswith("• ")
                    ]

                await poll(
                    lambda: (
                        storm_root()
                        and len(lines(storm_root()[0]["id"])) == GROUPS - THRESHOLD
                        and finals(storm_root()[0]["id"])
                        and all(finals(r["id"]) for r in roots())
                    ),
                    timeout_s=90,
                    what="the storm thread and every analysis",
                )
                storm = storm_root()[0]
                own = [r for r in roots() if "FIRING" in r["message"]]
                print(
                    f"{GROUPS} groups: {len(own)} own threads, 1 storm thread with "
                    f"{len(lines(storm['id']))} group lines and {len(finals(storm['id']))} analysis"
                )
                assert (len(roots()), len(own), len(finals(storm["id"]))) == (THRESHOLD + 1, THRESHOLD, 1)
                assert all(len(finals(r["id"])) == 1 for r in own)
                joined = " ".join(p["message"] for p in lines(storm["id"]))
                # Which groups came first is the receiver's processing order (notifications are
                # handled concurrently, as Alertmanager sends them): every group is in exactly one
                # place, its own thread or one line of the storm thread.
                in_storm = {name for name in names if f"*{name}*" in joined}
                in_own = {name for name in names if any(name in r["message"] for r in own)}
                assert len(in_storm) == GROUPS - THRESHOLD and len(in_own) == THRESHOLD, joined
                assert in_storm | in_own == set(names) and not in_storm & in_own
                assert bot.alert_receiver is not None and bot.alert_receiver.coalesced == GROUPS - THRESHOLD

                # A group of the storm resolves: its note lands in the storm thread.
                k = names.index(sorted(in_storm)[0])
                resolved = alert_payload("resolved", (f"fp{k}",), group=f"g{k}", name=names[k])
                async with session.post(url, json=resolved) as response:
                    assert response.status == 200
                await poll(
                    lambda: [
                        p
                        for p in mm.bot_posts()
                        if p["root_id"] == storm["id"] and "Resolved:" in p["message"]
                    ],
                    what="the resolve note in the storm thread",
                )
        finally:
            await bot.shutdown()
    with sqlite3.connect(tmp_path / "opsbot.db") as db:
        scenarios = [r[0] for r in db.execute("SELECT scenario FROM opsbot_requests")]
    assert scenarios == ["alert_summary"] * (THRESHOLD + 1)  # 4 analyses, not 20
