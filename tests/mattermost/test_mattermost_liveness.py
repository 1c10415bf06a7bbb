"""Websocket liveness on Mattermost: a half-open socket (TCP up, nothing arrives, pings unanswered)
is replaced within ``ping interval + pong timeout`` by active pings, not receive silence, the new
socket is up before the old one is closed, and every mention made during the stall is answered
once (the REST catch-up after the new ``hello`` finds them)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fakes.mattermost_server import FakeMattermost
from mm_helpers import BotFactory

from bot.config import MattermostSettings

FOOTER_MARK = "request `"


def replies(fake: FakeMattermost, root: str) -> list[dict[str, Any]]:
    return [p for p in fake.bot_posts() if p["root_id"] == root]


async def _stall(
    fake: FakeMattermost,
    start_bot: BotFactory,
    *,
    ping_s: float,
    pong_s: float,
    stall_s: float,
    every_s: float,
) -> float:
    alice = fake.add_user("alice")
    channel = fake.add_channel("incidents", [alice, fake.bot_user_id])
    # Receive silence alone would take a minute: the pings with their deadline must do it.
    bot = await start_bot(
        websocket_ping_interval_s=ping_s, websocket_pong_timeout_s=pong_s, websocket_silence_s=60.0
    )
    await fake.wait_for(lambda: fake.live_connections() == 1)
    stalled = next(r for r in fake.ws_log if r["authenticated_at"] and "closed_at" not in r)
    fake.go_silent()
    asked: list[str] = []
    loop = asyncio.get_running_loop()
    end = loop.time() + stall_s
    while loop.time() < end:
        asked.append((await fake.user_posts(alice, channel, f"@opsbot still there? {len(asked)}"))["id"])
        await asyncio.sleep(min(every_s, max(0.0, end - loop.time())))
    await fake.wait_for(
        lambda: all(any(FOOTER_MARK in p["message"] for p in replies(fake, m)) for m in asked), timeout=120
    )
    assert all(len(replies(fake, m)) == 1 for m in asked)  # each answered once
    replacement = next(r for r in fake.ws_log if (r["authenticated_at"] or 0) > stalled["stalled_at"])
    await fake.wait_for(lambda: "closed_at" in stalled)
    assert stalled["closed_at"] >= replacement["authenticated_at"]  # given up only after the new one is up
    assert bot.adapter.ws_replaced >= 1
    took = replacement["authenticated_at"] - stalled["stalled_at"]
    print(
        f"\nmattermost websocket: stalled {stall_s:g} s, replaced after {took:.2f} s, {len(asked)} mentions"
    )
    return float(took)


@pytest.mark.timeout(120)
async def test_a_half_open_socket_is_replaced_within_ping_plus_pong_timeout_and_no_mention_is_lost(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    took = await _stall(fake, start_bot, ping_s=0.5, pong_s=0.5, stall_s=4.5, every_s=0.5)
    assert took <= 2.0, f"replaced after {took:.1f} s"


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_with_the_default_settings_a_45_s_stall_is_replaced_within_20_s_and_every_mention_answered(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    defaults = MattermostSettings()
    took = await _stall(
        fake,
        start_bot,
        ping_s=defaults.websocket_ping_interval_s,
        pong_s=defaults.websocket_pong_timeout_s,
        stall_s=45.0,
        every_s=5.0,
    )
    assert took <= 20.0, f"replaced after {took:.1f} s"
