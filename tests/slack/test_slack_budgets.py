"""The transport under every Slack call: a post stored before its 5xx / timeout is found by its
metadata instead of posted twice, a ``Retry-After`` holds its method for the whole app, and Socket
Mode reconnects back off under ``[slack.reconnect]``."""

from __future__ import annotations

import pytest
from fakes.paced_engine import PacedEngine
from fakes.slack_harness import BotFactory, answers, settled
from fakes.slack_server import FakeSlack, FaultRule

from bot.metrics import CHAT_API_RETRIES

pytestmark = pytest.mark.timeout(120)


def _retries(method: str, reason: str) -> float:
    return float(CHAT_API_RETRIES.labels("slack", method, reason)._value.get())  # type: ignore[attr-defined]


@pytest.mark.parametrize("fault", ["server_error", "dropped"])
async def test_a_post_stored_before_its_failure_is_found_by_its_metadata_and_not_posted_twice(
    slack: FakeSlack, make_bot: BotFactory, fault: str
) -> None:
    bot = await make_bot()
    before = _retries("chat.postMessage", "server_error" if fault == "server_error" else "connection")
    rule = FaultRule(methods=frozenset({"chat.postMessage"}), after=True, times=1, **{fault: 1.0})
    slack.rules.append(rule)
    event = slack.user_message("C1", "U1", f"<@{slack.bot_user_id}> is redis up?")
    await slack.deliver_event(slack.mention_events(event)[0])
    await slack.wait_for(lambda: len(answers(slack, "C1")) == 1)
    await settled(bot)
    assert rule.injected == 1
    assert len(slack.bot_messages("C1")) == 1  # stored once, found again, not re-posted
    lookups = [c for c in slack.calls if c.method == "conversations.replies"]
    assert lookups and lookups[0].params["include_all_metadata"] == "true"
    posts = [c for c in slack.calls if c.method == "chat.postMessage"]
    assert len(posts) == 1  # the lookup answered for the retry
    tag = posts[0].params["metadata"]
    assert tag["event_type"] == "opsbot_post" and tag["event_payload"]["post_key"]
    after = _retries("chat.postMessage", "server_error" if fault == "server_error" else "connection")
    assert after == before  # nothing had to be sent again


async def test_an_rca_quote_stored_before_its_500_is_found_in_the_channel_history(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot()
    slack.rules.append(
        FaultRule(methods=frozenset({"chat.postMessage"}), server_error=1.0, after=True, times=1)
    )
    await slack.deliver("slash_commands", slack.slash_command("C1", "U7", "payments-api 5xx spike"))
    await slack.wait_for(lambda: len(answers(slack, "C1")) == 1)
    await settled(bot)
    quotes = [m for m in slack.bot_messages("C1") if m.thread_ts is None]
    assert len(quotes) == 1 and answers(slack, "C1")[0].thread_ts == quotes[0].ts
    assert [c.method for c in slack.calls if c.method.startswith("conversations.")] == [
        "conversations.history"
    ]


async def test_a_retry_after_for_one_answer_holds_that_method_for_every_channel(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot(edit_interval_s=0.3, max_tokens=30, wrap_engine=lambda e: PacedEngine(e, 0.05))
    rule = FaultRule(methods=frozenset({"chat.update"}), ratelimited=0.4, retry_after_s=1, times=5, seed=3)
    slack.rules.append(rule)
    asked = []
    for i in range(8):
        event = slack.user_message(f"C{i % 4}", f"U{i}", f"<@{slack.bot_user_id}> check {i}")
        await slack.deliver_event(slack.mention_events(event)[0])
        asked.append(event)
    await slack.wait_for(lambda: len(answers(slack)) == 8, timeout_s=90)
    await settled(bot)
    assert rule.injected == 5
    # Slack counts per method per app: after a 429 no chat.update went out, on any channel, before
    # its Retry-After had passed. (Calls already on their way when the 429 was given arrive within
    # milliseconds of it; client and fake share one event loop, so that is the only way to tell.)
    late = [c for c in slack.calls if c.inside_retry_after and c.at - (c.window_from or 0) > 0.1]
    assert not late, late
    assert sorted(m.thread_ts or "" for m in answers(slack)) == sorted(str(e["ts"]) for e in asked)


async def test_socket_mode_reconnects_back_off_under_slack_reconnect_until_the_link_works(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot(reconnect={"initial_s": 0.05, "max_s": 0.2})
    await slack.wait_for(lambda: slack.open_connections == 2)  # the pool's two connections
    slack.refuse_links = 3
    opened = slack.connections_opened
    await slack.disconnect(reason="refresh_requested", drop=True)
    await slack.wait_for(lambda: slack.connections_opened > opened and slack.open_connections == 2)
    assert slack.links_refused == 3
    event = slack.user_message("D1", "U1", "back?", channel_type="im")
    await slack.deliver_event(event)
    await slack.wait_for(lambda: len(answers(slack, "D1")) == 1)
    await settled(bot)
