"""Socket Mode liveness: a half-open connection (TCP up, nothing arrives either way, pings go
unanswered) is replaced within ``ping interval + pong timeout`` whatever the traffic, the new
connection is opened before the old one is given up, and every mention made during the stall is
answered exactly once (Slack redelivers an envelope not acknowledged within its timeout)."""

from __future__ import annotations

import asyncio

import pytest
from fakes.slack_harness import BotFactory, answers, settled
from fakes.slack_server import FakeSlack

from bot.config import SlackSettings


async def _stall(
    slack: FakeSlack, make_bot: BotFactory, *, ping_s: float, pong_s: float, stall_s: float, every_s: float
) -> float:
    """Stall one of the two connections for ``stall_s`` with a mention every ``every_s``; return how
    long the connection took to be replaced (fake clock)."""
    bot = await make_bot(socket_ping_interval_s=ping_s, socket_pong_timeout_s=pong_s)
    await slack.wait_for(lambda: slack.open_connections == 2)  # the pool's two
    stalled = slack.socket_log[-1]
    slack.stall(stalled.number)  # one goes half-open; Slack keeps routing envelopes into it
    assert stalled.stalled_at is not None
    asked: list[str] = []
    loop = asyncio.get_running_loop()
    end = loop.time() + stall_s
    while loop.time() < end:
        event = slack.user_message("C1", "U1", f"<@{slack.bot_user_id}> still there? {len(asked)}")
        for e in slack.mention_events(event):
            await slack.deliver_event(e)
        asked.append(str(event["ts"]))
        await asyncio.sleep(min(every_s, max(0.0, end - loop.time())))
    await slack.unstall()
    await slack.wait_for(lambda: len(answers(slack, "C1")) == len(asked), timeout_s=120)
    await settled(bot)
    assert sorted(m.thread_ts or "" for m in answers(slack, "C1")) == sorted(asked)
    assert len(slack.bot_messages("C1")) == len(asked)  # each answered once
    replacement = next(r for r in slack.socket_log if r.hello_at > stalled.stalled_at)
    # given up only after its replacement said hello
    assert stalled.closed_at is not None and stalled.closed_at >= replacement.hello_at
    assert bot.adapter.socket is not None and bot.adapter.socket.replacements >= 1
    took = replacement.hello_at - stalled.stalled_at
    print(f"\nslack socket mode: stalled {stall_s:g} s, replaced after {took:.2f} s, {len(asked)} mentions")
    return took


@pytest.mark.timeout(120)
async def test_a_half_open_socket_is_replaced_within_ping_plus_pong_timeout_and_no_mention_is_lost(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    slack.redeliver_after_s = 1.0  # Slack's ack timeout, scaled like the rest
    took = await _stall(slack, make_bot, ping_s=0.5, pong_s=0.5, stall_s=4.5, every_s=0.5)
    assert took <= 2.0, f"replaced after {took:.1f} s"


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_with_the_default_settings_a_45_s_stall_is_replaced_within_20_s_and_every_mention_answered(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    defaults = SlackSettings()
    slack.redeliver_after_s = 3.0  # Slack redelivers what was not acknowledged within 3 s
    took = await _stall(
        slack,
        make_bot,
        ping_s=defaults.socket_ping_interval_s,
        pong_s=defaults.socket_pong_timeout_s,
        stall_s=45.0,
        every_s=5.0,
    )
    assert took <= 20.0, f"replaced after {took:.1f} s"


@pytest.mark.timeout(120)
async def test_with_two_connections_one_dead_socket_does_not_hold_up_delivery_while_it_is_replaced(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    """The default keeps two connections: what Slack routed into the dead one is redelivered on the
    other after its ack timeout, long before the dead one is found and replaced (slow pings here)."""
    assert SlackSettings.model_fields["socket_connections"].default >= 2
    slack.redeliver_after_s = 1.0  # Slack's ack timeout, scaled like the rest
    bot = await make_bot(socket_ping_interval_s=10.0, socket_pong_timeout_s=10.0)
    await slack.wait_for(lambda: slack.open_connections == 2)
    dead = slack.socket_log[-1]
    slack.stall(dead.number)
    loop = asyncio.get_running_loop()
    started = loop.time()
    asked = []
    for i in range(6):  # round robin: half of them go into the dead socket
        event = slack.user_message("C1", "U1", f"<@{slack.bot_user_id}> still there? {i}")
        await slack.deliver_event(slack.mention_events(event)[0])
        asked.append(str(event["ts"]))
    await slack.wait_for(lambda: len(answers(slack, "C1")) == len(asked), timeout_s=15)
    took = loop.time() - started
    assert took < 8.0, f"answered after {took:.1f} s"
    assert dead.stalled_at is not None
    replaced = any(r.hello_at > dead.stalled_at for r in slack.socket_log)
    assert not replaced  # delivery did not wait for the dead socket to be found and replaced
    await settled(bot)
    assert sorted(m.thread_ts or "" for m in answers(slack, "C1")) == sorted(asked)
    assert len(slack.bot_messages("C1")) == len(asked)  # each answered once
