"""Incident bursts against a fake Mattermost whose rate limiter is on with the server's defaults
(10 requests per second per user, a burst of 100): 32 answers over 4 channels and 64 over 16,
all streaming at once (the engine's answers replayed at a GPU-like pace).

Every mention is answered exactly once, no call is refused by the limiter or made while a
``Retry-After`` runs. The run prints what it measured; timing targets live in ``bench/``.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import pytest
from fakes.mattermost_server import FakeMattermost
from fakes.paced_engine import PacedEngine
from mm_helpers import BotFactory

from bot.config import MattermostSettings

FOOTER_MARK = "request `"
SHIPPED = {
    name: MattermostSettings.model_fields[name].default
    for name in ("post_placeholder", "channel_post_interval_s", "edit_interval_s")
}
"""The shipped delivery settings (the fixture pins older ones for the older tests)."""


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def _burst(fake: FakeMattermost, start_bot: BotFactory, n: int, channels: int) -> dict[str, Any]:
    users = [fake.add_user(f"oncall{i}") for i in range(16)]
    rooms = [fake.add_channel(f"incident-{c}", [*users, fake.bot_user_id]) for c in range(channels)]
    bot = await start_bot(max_tokens=40, wrap_engine=lambda e: PacedEngine(e, 0.1), **SHIPPED)
    # The incident starts once opsbot has settled in (its start-up catch-up spent part of the
    # burst allowance): wait until the budget is whole again.
    budget, burst = bot.adapter.rest.budget, bot.adapter.settings.rate_limit.burst
    deadline = time.monotonic() + 30
    while budget.spare("GET /users/me") < burst:
        assert time.monotonic() < deadline, "the rate budget never refilled"
        await asyncio.sleep(0.1)
    asked: dict[str, float] = {}
    for i in range(n):
        post = await fake.user_posts(users[i % len(users)], rooms[i % channels], f"@opsbot what broke #{i}?")
        asked[post["id"]] = time.monotonic()

    def replies(root: str) -> list[dict[str, Any]]:
        return [p for p in fake.bot_posts() if p["root_id"] == root]

    await fake.wait_for(
        lambda: all(any(FOOTER_MARK in p["message"] for p in replies(r)) for r in asked), timeout=240
    )
    sign_of_life: list[float] = []
    complete: list[float] = []
    for root, at in asked.items():
        mine = replies(root)
        assert len(mine) == 1, f"thread {root}: {len(mine)} bot posts"  # 0 lost, 0 duplicated
        reacted = [t for t, op, post, _ in fake.reaction_log if post == root and op == "add"][:1]
        posted = [
            c.started for c in fake.calls_to("POST", "/api/v4/posts") if (c.body or {}).get("root_id") == root
        ]
        sign_of_life.append(min(reacted + posted[:1]) - at)
        edits = [c.finished for c in fake.calls_to("PUT", rf"/api/v4/posts/{mine[0]['id']}/patch")]
        complete.append(
            max(
                [
                    c.finished
                    for c in fake.calls_to("POST", "/api/v4/posts")
                    if (c.body or {}).get("root_id") == root
                ]
                + edits
            )
            - at
        )
    starts = sorted(c.started for c in fake.calls)
    busiest = max(sum(1 for t in starts if s <= t < s + 1.0) for s in starts)
    stats = {
        "answers": n,
        "channels": channels,
        "sign_of_life_p50_s": statistics.median(sign_of_life),
        "sign_of_life_p99_s": _p(sign_of_life, 99),
        "complete_p50_s": statistics.median(complete),
        "complete_p99_s": _p(complete, 99),
        "limited_429s": sum(1 for c in fake.calls if c.limited),
        "inside_retry_after": sum(1 for c in fake.calls if c.inside_retry_after),
        "busiest_second": busiest,
        "calls": len(fake.calls),
        "reactions_swapped": bot.adapter.housekeeping.done,
    }
    print(f"\nmattermost burst {n} answers / {channels} channels: {stats}")
    return stats


def _check(stats: dict[str, Any]) -> None:
    assert stats["limited_429s"] == 0
    assert stats["inside_retry_after"] == 0


@pytest.mark.timeout(300)
async def test_32_concurrent_answers_over_4_channels_stay_inside_the_servers_rate_limit(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    _check(await _burst(fake, start_bot, 32, 4))


@pytest.mark.timeout(400)
async def test_64_concurrent_answers_over_16_channels_stay_inside_the_servers_rate_limit(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    _check(await _burst(fake, start_bot, 64, 16))


@pytest.mark.timeout(120)
async def test_a_retry_after_for_one_call_holds_every_call_of_the_bot_account(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    users = [fake.add_user(f"oncall{i}") for i in range(4)]
    rooms = [fake.add_channel(f"incident-{c}", [*users, fake.bot_user_id]) for c in range(4)]
    await start_bot(
        max_tokens=30, wrap_engine=lambda e: PacedEngine(e, 0.05), **{**SHIPPED, "edit_interval_s": 0.3}
    )
    fault = fake.add_fault("PUT", r"/api/v4/posts/\w+/patch", 429, probability=0.4, count=5, retry_after=1.0)
    roots = [
        (await fake.user_posts(users[i % 4], rooms[i % 4], f"@opsbot check {i}"))["id"] for i in range(8)
    ]

    def done() -> bool:
        return all(
            any(FOOTER_MARK in p["message"] for p in fake.bot_posts() if p["root_id"] == r) for r in roots
        )

    await fake.wait_for(done, timeout=90)
    assert fault.remaining == 0
    # The server's limiter counts every request of the user: after a 429 nothing at all went out
    # (edits, posts, reactions, any channel) before its Retry-After had passed. Calls already on
    # their way arrive within milliseconds of it (client and fake share one event loop).
    late = [c for c in fake.calls if c.inside_retry_after and c.started - (c.window_from or 0) > 0.1]
    assert not late, late
    assert all(len([p for p in fake.bot_posts() if p["root_id"] == r]) == 1 for r in roots)
