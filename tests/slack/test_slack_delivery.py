"""Never twice, never lost: retries, replicas, a flood of ``/rca``, a flaky Web API, reconnects."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from fakes.slack_harness import BotFactory, answers, request_rows, settled
from fakes.slack_server import CHAT_METHODS, ApiCall, FakeSlack, FaultRule

from bot.metrics import CHAT_API_RETRIES
from inference.engine import (
    Engine,
    GenerationEvent,
    GenerationRequest,
    WrappedEngine,
)


class StalledEngine(WrappedEngine):
    """The real engine, except that ``generate`` waits until the test releases it (stalling only)."""

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner)
        self.release = asyncio.Event()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:  # type: ignore[override]
        await self.release.wait()
        async for event in self.inner.generate(request):
            yield event

    async def shutdown(self, drain_timeout_s: float = 30.0) -> None:
        self.release.set()
        await self.inner.shutdown(drain_timeout_s)


async def _mention_four_times(slack: FakeSlack, channel: str, text: str) -> dict[str, Any]:
    event: dict[str, Any] = slack.user_message(channel, "U1", f"<@{slack.bot_user_id}> {text}")
    for e in slack.mention_events(event):
        await slack.deliver_event(e, copies=4)  # the first delivery and three retries, each
    return event


@pytest.mark.timeout(120)
async def test_every_event_delivered_four_times_gets_exactly_one_answer_and_one_row(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot()
    events = [await _mention_four_times(slack, "C1", f"question {i}") for i in range(5)]
    await slack.wait_for(lambda: len(answers(slack, "C1")) == 5, timeout_s=60)
    await slack.wait_for(lambda: all(env.acked_at for env in slack.envelopes.values()))
    await settled(bot)
    assert len(slack.envelopes) == 5 * 2 * 4
    assert sorted(m.thread_ts or "" for m in slack.bot_messages("C1")) == sorted(str(e["ts"]) for e in events)
    rows = await request_rows(bot.store)
    assert sorted(r[1] for r in rows) == sorted(str(e["ts"]) for e in events)


@pytest.mark.postgres
@pytest.mark.timeout(180)
async def test_two_replicas_sharing_postgres_answer_each_event_exactly_once(
    slack: FakeSlack, make_bot: BotFactory, pg_url: str, tmp_path: object
) -> None:
    first = await make_bot(db_url=pg_url)
    second = await make_bot(db_url=pg_url)
    await slack.wait_for(lambda: slack.open_connections == 4)  # two per replica
    events = [await _mention_four_times(slack, "C1", f"replica question {i}") for i in range(6)]
    await slack.wait_for(lambda: len(answers(slack, "C1")) == 6, timeout_s=90)
    await slack.wait_for(lambda: all(env.acked_at for env in slack.envelopes.values()))
    await settled(first, second)
    # round robin spread the deliveries over all four connections, both replicas'
    assert {env.connection for env in slack.envelopes.values()} == {1, 2, 3, 4}
    assert sorted(m.thread_ts or "" for m in slack.bot_messages("C1")) == sorted(str(e["ts"]) for e in events)
    await request_rows(second.store)  # each replica writes its own rows: wait for both buffers
    rows = await request_rows(first.store)
    assert sorted(r[1] for r in rows) == sorted(str(e["ts"]) for e in events)


@pytest.mark.timeout(120)
async def test_250_rca_commands_with_the_engine_stalled_are_all_acked_within_3_s(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    # every generation waits until the end of the test: the engine is stalled
    await make_bot(wrap_engine=StalledEngine)
    envelopes = [
        await slack.deliver(
            "slash_commands", slack.slash_command(f"C{i % 5}", f"U{i}", f"service-{i} is down")
        )
        for i in range(250)
    ]
    await slack.wait_for(lambda: all(env.acked_at for env in envelopes), timeout_s=60)
    waits = sorted(env.acked_at - env.sent_at for env in envelopes)  # type: ignore[operator]
    assert waits[-1] < 3.0, f"slowest ack {waits[-1]:.2f} s"
    assert answers(slack) == []  # nothing was answered: the engine really was stalled


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_flaky_web_api_still_delivers_100_answers_honouring_retry_after_and_pacing(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    retries_before = sum(
        CHAT_API_RETRIES.labels("slack", m, r)._value.get()  # type: ignore[attr-defined]
        for m in CHAT_METHODS
        for r in ("ratelimited", "server_error", "connection")
    )
    bot = await make_bot(
        retry={"initial_s": 0.05, "max_retries": 14}, channel_post_interval_s=1.0, edit_interval_s=1.0
    )
    slack.rules.append(FaultRule(methods=CHAT_METHODS, ratelimited=0.3, server_error=0.2, seed=7))
    events = []
    for i in range(100):
        event = slack.user_message("C1", f"U{i}", f"<@{slack.bot_user_id}> check {i}")
        await slack.deliver_event(slack.mention_events(event)[0])
        events.append(event)
    # Pacing (1 post/s) plus Retry-After waits make this take 4-7 min on 2 cores, depending on how
    # the faults fall; the deadline is generous because delivery, not speed, is what is checked.
    await slack.wait_for(lambda: len(answers(slack, "C1")) == 100, timeout_s=840)
    await settled(bot)

    assert sorted(m.thread_ts or "" for m in answers(slack, "C1")) == sorted(str(e["ts"]) for e in events)
    calls = [c for c in slack.calls if c.method in CHAT_METHODS]
    assert (
        sum(c.fault == "ratelimited" for c in calls) > 20
        and sum(c.fault == "server_error" for c in calls) > 10
    )

    # none sent before its Retry-After: the retry of a 429'd call (the next call on the same message
    # for chat.update, the next post to the channel for chat.postMessage) waits until it expires
    def target(call: ApiCall) -> tuple[str, str | None, object]:
        return (call.method, call.channel, call.params.get("ts") if call.method == "chat.update" else None)

    for i, limited in enumerate(calls):
        if limited.fault != "ratelimited":
            continue
        assert limited.retry_after_s is not None
        retry = next((c for c in calls[i + 1 :] if target(c) == target(limited)), None)
        assert retry is not None
        assert retry.at >= limited.at + limited.retry_after_s, f"{limited.method} retried too early"
    # none faster than one accepted post per second in the channel
    posted = [c.at for c in calls if c.method == "chat.postMessage" and c.ok]
    assert len(posted) == 100
    gaps = [b - a for a, b in zip(posted, posted[1:], strict=False)]
    assert min(gaps) >= 0.999, f"two posts {min(gaps):.3f} s apart"
    retries_after = sum(
        CHAT_API_RETRIES.labels("slack", m, r)._value.get()  # type: ignore[attr-defined]
        for m in CHAT_METHODS
        for r in ("ratelimited", "server_error", "connection")
    )
    assert retries_after - retries_before == sum(1 for c in calls if c.fault)


@pytest.mark.timeout(150)
async def test_socket_mode_disconnect_every_few_messages_loses_no_mention(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot()
    events = []
    for i in range(15):
        event = slack.user_message("C1", "U1", f"<@{slack.bot_user_id}> still there? {i}")
        for e in slack.mention_events(event):
            await slack.deliver_event(e)
        events.append(event)
        if i % 3 == 2:  # mid-stream: some of these envelopes are not acked yet
            opened = slack.connections_opened
            await slack.disconnect(reason="refresh_requested", drop=True)
            await slack.wait_for(lambda: slack.connections_opened > opened and slack.open_connections == 2)  # noqa: B023
    await slack.wait_for(lambda: len(answers(slack, "C1")) == 15, timeout_s=120)
    await settled(bot)
    assert slack.connections_opened >= 5
    assert sorted(m.thread_ts or "" for m in answers(slack, "C1")) == sorted(str(e["ts"]) for e in events)
    assert len(slack.bot_messages("C1")) == 15


def _retries(method: str, reason: str) -> float:
    return float(CHAT_API_RETRIES.labels("slack", method, reason)._value.get())  # type: ignore[attr-defined]


@pytest.mark.timeout(120)
async def test_dropped_connections_and_500s_are_retried_with_backoff_and_counted(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot()
    dropped_before = _retries("chat.postMessage", "connection")
    failed_before = _retries("chat.update", "server_error")
    slack.rules.append(FaultRule(methods=frozenset({"chat.postMessage"}), dropped=1.0, times=2))
    slack.rules.append(FaultRule(methods=frozenset({"chat.update"}), server_error=1.0, times=2))
    await slack.deliver_event(slack.user_message("D1", "U1", "are you there?", channel_type="im"))
    await slack.wait_for(lambda: len(answers(slack, "D1")) == 1)
    await settled(bot)
    assert _retries("chat.postMessage", "connection") - dropped_before == 2
    assert _retries("chat.update", "server_error") - failed_before == 2
    assert len(slack.bot_messages("D1")) == 1  # a dropped request was never half-posted
