"""No answer waits for ever on the rate budget: first posts into one channel at once, creates in
5xx backoff, the app-wide bucket, and a storm of 429 / 500 on post create and patch.

Each answer here shows its sign of life as a reaction and posts its first message with its first
text (``post_placeholder = "auto"``), the shipped default: that first post is paid for by the
streaming reply and passed to the transport (``bot.adapters.ratelimit.prepaid``). It used to be
charged twice and its token held through the create's retries, so three answers first-posting into
one channel at once (the channel's burst) waited for each other for ever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from fakes.mattermost_server import FakeMattermost
from fakes.paced_engine import LockstepEngine, PacedEngine
from mm_helpers import BotFactory, request_rows
from prometheus_client import REGISTRY

from inference.engine import Engine

FOOTER_MARK = "request `"

pytestmark = pytest.mark.timeout(120)


def paced(interval_s: float) -> Callable[[Engine], Engine]:
    return lambda engine: PacedEngine(engine, interval_s)


def lockstep(group: int) -> Callable[[Engine], Engine]:
    """Answers whose first words come in one engine step, ``group`` at a time (a GPU batch)."""
    return lambda engine: LockstepEngine(engine, group)


def replies(fake: FakeMattermost, root: str) -> list[dict[str, Any]]:
    return [p for p in fake.bot_posts() if p["root_id"] == root]


def finals(fake: FakeMattermost, roots: list[str]) -> int:
    return sum(1 for root in roots if any(FOOTER_MARK in p["message"] for p in replies(fake, root)))


async def ask(fake: FakeMattermost, user: str, channel: str, n: int) -> list[str]:
    return [(await fake.user_posts(user, channel, f"@opsbot why is q{i} down?"))["id"] for i in range(n)]


async def assert_all_answered_once(fake: FakeMattermost, bot: Any, roots: list[str], timeout: float) -> None:
    try:
        await fake.wait_for(lambda: finals(fake, roots) == len(roots), timeout=timeout)
    except AssertionError:
        pytest.fail(f"{finals(fake, roots)} of {len(roots)} answered within {timeout:g} s")
    assert [len(replies(fake, r)) for r in roots] == [1] * len(roots)  # one post each, no duplicates
    assert await request_rows(bot.adapter.store, len(roots)) == len(roots)


async def test_three_and_more_answers_first_posting_into_one_channel_at_once_all_arrive(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    alice = fake.add_user("alice")
    channel = fake.add_channel("incidents", [alice, fake.bot_user_id])
    bot = await start_bot(
        post_placeholder="auto",
        channel_post_interval_s=0.1,
        max_tokens=12,
        ignore_eos=True,
        wrap_engine=lockstep(3),
    )
    roots = await ask(fake, alice, channel, 6)
    await assert_all_answered_once(fake, bot, roots, timeout=30)


async def test_two_creates_in_5xx_backoff_and_a_third_first_post_all_arrive(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    alice = fake.add_user("alice")
    channel = fake.add_channel("incidents", [alice, fake.bot_user_id])
    bot = await start_bot(
        post_placeholder="auto",
        channel_post_interval_s=0.1,
        max_tokens=12,
        ignore_eos=True,
        wrap_engine=paced(0.05),
        retry={"initial_s": 0.5, "max_s": 1.0},
    )
    # The first two creates fail and back off; the third answer's first post comes meanwhile.
    fake.add_fault("POST", "/api/v4/posts", 500, count=2)
    roots = await ask(fake, alice, channel, 3)
    await assert_all_answered_once(fake, bot, roots, timeout=30)
    assert sum(1 for c in fake.calls_to("POST", "/api/v4/posts") if c.status == 500) == 2


async def test_edits_sharing_the_app_wide_bucket_all_arrive(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    """Every call of the bot account shares one bucket (the server limits requests per user): four
    answers editing at once, in four channels, with a burst of three."""
    alice = fake.add_user("alice")
    channels = [fake.add_channel(f"incident-{i}", [alice, fake.bot_user_id]) for i in range(4)]
    bot = await start_bot(
        post_placeholder="always",  # placeholders first: then every text is an edit
        channel_post_interval_s=0.0,  # no per-channel bucket: the app-wide one alone
        rate_limit={"per_minute": 6000, "burst": 3},
        max_tokens=12,
        ignore_eos=True,
        wrap_engine=lockstep(4),
    )
    roots = [r for channel in channels for r in await ask(fake, alice, channel, 1)]
    await assert_all_answered_once(fake, bot, roots, timeout=30)


@pytest.mark.slow
async def test_a_storm_of_429_and_500_on_create_and_patch_in_one_channel_answers_every_mention_once(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    alice = fake.add_user("alice")
    channel = fake.add_channel("incidents", [alice, fake.bot_user_id])
    bot = await start_bot(
        post_placeholder="auto",
        channel_post_interval_s=0.1,
        max_tokens=16,
        ignore_eos=True,
        wrap_engine=lockstep(4),
    )
    for method, path in (("POST", "/api/v4/posts"), ("PUT", r"/api/v4/posts/\w+/patch")):
        fake.add_fault(method, path, 429, probability=0.1, retry_after=0.2, seed=11)
        fake.add_fault(method, path, 500, probability=0.45, seed=12)
    roots = await ask(fake, alice, channel, 20)
    await assert_all_answered_once(fake, bot, roots, timeout=90)
    assert any(c.status == 500 for c in fake.calls_to("PUT", r"/api/v4/posts/\w+/patch"))


async def test_an_answer_whose_platform_calls_hang_is_failed_visibly_by_the_watchdog(
    fake: FakeMattermost, start_bot: BotFactory, caplog: pytest.LogCaptureFixture
) -> None:
    alice = fake.add_user("alice")
    channel = fake.add_channel("incidents", [alice, fake.bot_user_id])
    stalled_before = (
        REGISTRY.get_sample_value("opsbot_answers_stalled_total", {"platform": "mattermost"}) or 0
    )
    bot = await start_bot(post_placeholder="always", answer_stall_s=1.5, request_timeout_s=20.0)
    fake.add_latency("PUT", r"/api/v4/posts/\w+/patch", 60.0)  # every edit hangs (no answer at all)
    root = (await fake.user_posts(alice, channel, "@opsbot why is checkout down?"))["id"]
    started = asyncio.get_running_loop().time()
    await fake.wait_for(lambda: any("stopped this answer" in p["message"] for p in replies(fake, root)), 15)
    assert asyncio.get_running_loop().time() - started < 10  # the watchdog, not the call's 20 s timeout
    await fake.wait_for(lambda: fake.reaction_names(root) == ["warning"])
    rows = await request_rows(bot.adapter.store, 1)
    assert rows == 1
    async with bot.adapter.store.engine.connect() as conn:
        status = (await conn.execute(sa.text("SELECT status, error FROM opsbot_requests"))).one()
        claim = (await conn.execute(sa.text("SELECT state FROM opsbot_processed_events"))).scalar_one()
    assert status[0] == "stalled" and "no progress for 1.5 s" in status[1]
    assert claim == "done"  # released: a replica's sweeper will not note it again
    assert (
        REGISTRY.get_sample_value("opsbot_answers_stalled_total", {"platform": "mattermost"})
        == stalled_before + 1
    )
    assert any("stopped by the watchdog" in r.getMessage() for r in caplog.records if r.levelname == "ERROR")
