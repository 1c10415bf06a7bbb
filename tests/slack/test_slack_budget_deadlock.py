"""No answer waits for ever on the rate budget (Slack): first posts into one channel at once, posts in
5xx backoff, the app-wide bucket of a method, and a storm of 429 / 500 on post and update.

The twins of ``tests/mattermost/test_mattermost_budget_deadlock.py``: each answer shows its sign of
life as a reaction and posts its first message with its first text (``post_placeholder =
"auto"``), so its first ``chat.postMessage`` is paid for by the streaming reply and passed to the
transport (``bot.adapters.ratelimit.prepaid``), which spends it on the first try only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from fakes.paced_engine import LockstepEngine
from fakes.slack_harness import BotFactory, answers, request_rows, settled
from fakes.slack_server import FakeSlack, FaultRule

from inference.engine import Engine

pytestmark = pytest.mark.timeout(180)

FIRST_TEXT_POSTS = {"streaming": "edit", "post_placeholder": "auto", "channel_post_burst": 3}
"""Post-and-edit, the first message posted with the first text (a reaction was the sign of life),
the channel's shipped burst of 3."""


def lockstep(group: int) -> Callable[[Engine], Engine]:
    """Answers whose first words come in one engine step, ``group`` at a time (a GPU batch)."""
    return lambda engine: LockstepEngine(engine, group)


async def ask(slack: FakeSlack, channel: str, n: int) -> list[dict[str, Any]]:
    events = []
    for i in range(n):
        event = slack.user_message(channel, f"U{i}", f"<@{slack.bot_user_id}> why is q{i} down?")
        await slack.deliver_event(slack.mention_events(event)[0])
        events.append(event)
    return events


async def assert_all_answered_once(
    slack: FakeSlack, bot: Any, events: list[dict[str, Any]], timeout_s: float
) -> None:
    def done() -> int:
        return len({m.thread_ts for m in answers(slack)} & {str(e["ts"]) for e in events})

    try:
        await slack.wait_for(lambda: done() == len(events), timeout_s=timeout_s)
    except AssertionError:
        pytest.fail(f"{done()} of {len(events)} answered within {timeout_s:g} s")
    await settled(bot)
    by_thread = [m.thread_ts for m in slack.bot_messages() if m.thread_ts in {str(e["ts"]) for e in events}]
    assert sorted(by_thread) == sorted(str(e["ts"]) for e in events)  # one message each, no duplicates
    assert len(await request_rows(bot.store)) == len(events)


async def test_three_and_more_answers_first_posting_into_one_channel_at_once_all_arrive(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot(**FIRST_TEXT_POSTS, max_tokens=12, wrap_engine=lockstep(3))
    events = await ask(slack, "C1", 6)
    await assert_all_answered_once(slack, bot, events, timeout_s=60)


async def test_two_posts_in_5xx_backoff_and_a_third_first_post_all_arrive(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot(
        **FIRST_TEXT_POSTS, max_tokens=12, wrap_engine=lockstep(3), retry={"initial_s": 0.5, "max_s": 1.0}
    )
    slack.rules.append(FaultRule(methods=frozenset({"chat.postMessage"}), server_error=1.0, times=2))
    events = await ask(slack, "C1", 3)
    await assert_all_answered_once(slack, bot, events, timeout_s=60)
    assert sum(c.fault == "server_error" for c in slack.calls if c.method == "chat.postMessage") == 2


async def test_edits_sharing_a_methods_app_wide_bucket_all_arrive(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    """Slack counts ``chat.update`` per app, whatever the channel: four answers editing at once, in
    four channels, with a burst of three."""
    bot = await make_bot(
        streaming="edit",
        post_placeholder="always",  # placeholders first: then every text is an edit
        rate_limits={"chat.update": {"per_minute": 6000, "burst": 3}},
        max_tokens=12,
        wrap_engine=lockstep(4),
    )
    events = [e for channel in ("C1", "C2", "C3", "C4") for e in await ask(slack, channel, 1)]
    await assert_all_answered_once(slack, bot, events, timeout_s=60)


@pytest.mark.slow
async def test_a_storm_of_429_and_500_on_post_and_update_in_one_channel_answers_every_mention_once(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot(
        **FIRST_TEXT_POSTS, max_tokens=16, channel_post_interval_s=0.1, wrap_engine=lockstep(4)
    )
    slack.rules.append(
        FaultRule(
            methods=frozenset({"chat.postMessage", "chat.update"}),
            ratelimited=0.1,
            server_error=0.45,
            seed=11,
        )
    )
    events = await ask(slack, "C1", 20)
    await assert_all_answered_once(slack, bot, events, timeout_s=150)
    assert any(c.fault == "server_error" for c in slack.calls if c.method == "chat.update")
