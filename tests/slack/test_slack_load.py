"""Incident bursts against a fake that enforces Slack's published tiers: 32 answers over 4 channels
and 64 over 16, all streaming at once (the engine's answers replayed at a GPU-like pace).

Every mention is answered exactly once, no call is made while a ``Retry-After`` runs, and
``chat.update`` / ``chat.appendStream`` stay inside their tiers in every 60 s window. The run
prints what it measured (sign of life, answer complete, calls per method); timing targets live in
``bench/``, not here.
"""

from __future__ import annotations

import statistics
from typing import Any

import pytest
from fakes.paced_engine import PacedEngine
from fakes.slack_harness import DEFAULTS, BotFactory, answers, has_footer, settled
from fakes.slack_server import TIERS, FakeSlack


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def _burst(slack: FakeSlack, make_bot: BotFactory, n: int, channels: int) -> dict[str, Any]:
    bot = await make_bot(**DEFAULTS, max_tokens=40, wrap_engine=lambda e: PacedEngine(e, 0.1))
    asked: dict[str, tuple[str, str, float]] = {}
    for i in range(n):
        channel, user = f"C{i % channels:02d}", f"U{i:03d}"
        event = slack.user_message(channel, user, f"<@{slack.bot_user_id}> what is wrong #{i}?")
        first, _ = [await slack.deliver_event(e) for e in slack.mention_events(event)]
        asked[str(event["ts"])] = (channel, user, first[0].sent_at or 0.0)
    await slack.wait_for(lambda: len(answers(slack)) >= n, timeout_s=240)
    await settled(bot, timeout_s=60)

    sign_of_life: list[float] = []
    complete: list[float] = []
    for ts, (channel, user, at) in asked.items():
        replies = slack.bot_messages(channel, ts)
        assert len(replies) == 1, f"thread {ts}: {len(replies)} bot messages"  # 0 lost, 0 duplicated
        (reply,) = replies
        assert has_footer(reply)
        asking = slack.find(channel, ts)
        assert asking is not None
        # the first thing the asker saw: a reaction, an ephemeral note (reaction tier spent), the reply
        shown = [t for t, op, _ in asking.reaction_log if op == "add"][:1] + [reply.posted_at]
        shown += [e["at"] for e in slack.ephemerals if e["user"] == user and e["channel"] == channel]
        sign_of_life.append(min(shown) - at)
        last = max([reply.posted_at] + [t for t, _, _ in reply.edits] + [t for t, _ in reply.appends])
        complete.append(last - at)
    calls = slack.calls
    per_method: dict[str, int] = {}
    for c in calls:
        per_method[c.method] = per_method.get(c.method, 0) + 1
    stats = {
        "answers": n,
        "channels": channels,
        "native": sum(1 for ts, (ch, _, _) in asked.items() if slack.bot_messages(ch, ts)[0].streamed),
        "sign_of_life_p50_s": statistics.median(sign_of_life),
        "sign_of_life_p99_s": _p(sign_of_life, 99),
        "ephemeral_signs": len(slack.ephemerals),
        "complete_p50_s": statistics.median(complete),
        "complete_p99_s": _p(complete, 99),
        "tier_429s": sum(1 for c in calls if c.fault == "tier"),
        "inside_retry_after": sum(1 for c in calls if c.inside_retry_after),
        "max_per_60s": {
            m: slack.calls_per_window(m) for m in ("chat.update", "chat.appendStream", "reactions.add")
        },
        "calls": per_method,
    }
    print(f"\nslack burst {n} answers / {channels} channels: {stats}")
    return stats


def _check(stats: dict[str, Any]) -> None:
    assert stats["inside_retry_after"] == 0
    assert stats["tier_429s"] == 0
    for method in ("chat.update", "chat.appendStream"):
        assert stats["max_per_60s"][method] <= TIERS[method][0], method


@pytest.mark.timeout(300)
async def test_32_concurrent_answers_over_4_channels_stay_inside_slacks_tiers_and_none_is_lost(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    _check(await _burst(slack, make_bot, 32, 4))


@pytest.mark.timeout(400)
async def test_64_concurrent_answers_over_16_channels_stay_inside_slacks_tiers_and_none_is_lost(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    _check(await _burst(slack, make_bot, 64, 16))
