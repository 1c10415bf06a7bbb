"""A sign of life within a second that spends no channel post: a reaction on the asking message
(the thread status in assistant threads), swapped for a done / failed reaction at the end; and the
engine never waits for the sign of life or the placeholder."""

from __future__ import annotations

import asyncio

import pytest
from fakes.paced_engine import FailingEngine, PacedEngine
from fakes.recording_engine import RecordingEngine
from fakes.slack_harness import DEFAULTS, BotFactory, answers, has_footer, request_rows, settled
from fakes.slack_server import FakeMessage, FakeSlack, FaultRule

from inference.engine import Engine

pytestmark = pytest.mark.timeout(120)


async def _ask(slack: FakeSlack, channel: str = "C1", user: str = "U1") -> FakeMessage:
    event = slack.user_message(channel, user, f"<@{slack.bot_user_id}> why is checkout slow?")
    for e in slack.mention_events(event):
        await slack.deliver_event(e)
    asking = slack.find(channel, str(event["ts"]))
    assert asking is not None
    return asking


async def test_eyes_come_before_the_answer_and_are_swapped_for_a_check_mark(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot(**DEFAULTS)
    asking = await _ask(slack)
    await slack.wait_for(lambda: len(answers(slack, "C1")) == 1)
    await settled(bot)
    await slack.wait_for(lambda: bool(asking.reactions.get("white_check_mark")))
    assert [(op, name) for _, op, name in asking.reaction_log] == [
        ("add", "eyes"),
        ("remove", "eyes"),
        ("add", "white_check_mark"),
    ]
    (reply,) = slack.bot_messages("C1")
    assert asking.reaction_log[0][0] < reply.posted_at  # shown before the answer's first message
    assert asking.reactions == {"eyes": [], "white_check_mark": [slack.bot_user_id]}
    assert slack.ephemerals == []  # a reaction, not a message


async def test_a_failed_answer_ends_with_the_failed_reaction(slack: FakeSlack, make_bot: BotFactory) -> None:
    bot = await make_bot(**DEFAULTS, wrap_engine=FailingEngine)
    asking = await _ask(slack)
    await slack.wait_for(lambda: len(answers(slack, "C1")) == 1)
    await settled(bot)
    await slack.wait_for(lambda: bool(asking.reactions.get("warning")))
    assert [name for _, op, name in asking.reaction_log if op == "add"] == ["eyes", "warning"]
    assert "ran out of memory" in answers(slack, "C1")[0].text


async def test_without_a_reaction_the_placeholder_post_is_the_sign_of_life(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot(**{**DEFAULTS, "streaming": "edit"}, ack_reaction="")
    asking = await _ask(slack)
    await slack.wait_for(lambda: len(answers(slack, "C1")) == 1)
    await settled(bot)
    assert asking.reaction_log == []
    assert not [c for c in slack.calls if c.method.startswith("reactions.")]
    first_post = next(c for c in slack.calls if c.method == "chat.postMessage")
    assert first_post.params["text"] == "_thinking…_"


async def test_once_the_reaction_tier_is_spent_an_ephemeral_note_is_the_sign_of_life(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    limits = {"reactions.add": {"per_minute": 2, "burst": 1}}
    bot = await make_bot(**DEFAULTS, rate_limits={**bot_limits(), **limits})
    first = await _ask(slack, user="U1")
    await slack.wait_for(lambda: bool(first.reaction_log))
    second = await _ask(slack, user="U2")
    await slack.wait_for(lambda: len(answers(slack, "C1")) == 2)
    await settled(bot)
    assert [name for _, op, name in second.reaction_log if op == "add"][:1] != ["eyes"]
    (note,) = slack.ephemerals
    assert note["user"] == "U2" and note["channel"] == "C1" and "Looking into it" in note["text"]
    assert note["at"] - second.posted_at < 5.0


def bot_limits() -> dict[str, dict[str, float]]:
    from bot.config import SLACK_RATE_LIMITS

    return {k: v.model_dump() for k, v in SLACK_RATE_LIMITS.items()}


async def test_in_an_assistant_thread_the_thread_status_is_the_sign_of_life(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot(**DEFAULTS)
    root = slack.user_message("D1", "U1", "", channel_type="im")
    started = {
        "type": "assistant_thread_started",
        "assistant_thread": {
            "user_id": "U1",
            "context": {"channel_id": "C1", "team_id": slack.team_id, "enterprise_id": None},
            "channel_id": "D1",
            "thread_ts": root["ts"],
        },
        "event_ts": root["ts"],
    }
    env = await slack.deliver("events_api", slack.event_callback(started))
    await slack.wait_for(lambda: env.acked_at is not None)
    question = slack.user_message(
        "D1", "U1", "what changed in payments?", thread_ts=root["ts"], channel_type="im"
    )
    await slack.deliver_event(question)
    await slack.wait_for(lambda: len(answers(slack, "D1")) == 1)
    await settled(bot)
    await slack.wait_for(lambda: len(slack.thread_statuses) == 2)
    assert [s for _, ch, ts, s in slack.thread_statuses] == ["is looking into it…", ""]
    assert all((ch, ts) == ("D1", root["ts"]) for _, ch, ts, _ in slack.thread_statuses)
    assert not [c for c in slack.calls if c.method.startswith("reactions.")]


async def test_the_engine_has_the_question_before_a_slow_placeholder_is_posted(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    """The placeholder is throttled (429, Retry-After 1 s): the engine is not kept waiting for it,
    the answer still lands once, in the thread, after the placeholder."""
    slack.rules.append(
        FaultRule(methods=frozenset({"chat.startStream", "chat.postMessage"}), ratelimited=1.0, times=1)
    )
    bot = await make_bot(**DEFAULTS, wrap_engine=RecordingEngine)
    engine: RecordingEngine = bot.engine  # type: ignore[assignment]
    await _ask(slack)
    for _ in range(100):  # the engine is not the fake's: polled
        if engine.requests:
            break
        await asyncio.sleep(0.01)
    assert slack.bot_messages("C1") == []  # submitted while the placeholder waits out Retry-After
    await slack.wait_for(lambda: len(answers(slack, "C1")) == 1)
    await settled(bot)
    (reply,) = slack.bot_messages("C1")
    assert reply.thread_ts is not None and has_footer(reply)
    assert [c.fault for c in slack.calls if c.method in ("chat.startStream", "chat.postMessage")][:2] == [
        "ratelimited",
        None,
    ]


async def test_when_the_placeholder_cannot_be_posted_the_engine_request_is_aborted(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    """Slack keeps failing the placeholder: the request the engine already has is stopped (no
    answer nobody will see keeps a batch slot), the row says why."""
    slack.rules.append(
        FaultRule(methods=frozenset({"chat.startStream", "chat.postMessage"}), server_error=1.0)
    )
    recorder: list[RecordingEngine] = []

    def wrap(engine: Engine) -> Engine:
        recorder.append(RecordingEngine(PacedEngine(engine, 0.2)))  # a long answer: 64 x 0.2 s
        return recorder[0]

    bot = await make_bot(  # the placeholder is the sign of life: it must be posted
        **{**DEFAULTS, "streaming": "edit"},
        ack_reaction="",
        max_tokens=64,
        wrap_engine=wrap,
        retry={"initial_s": 0.01, "max_retries": 2},
    )
    await _ask(slack)
    for _ in range(500):  # the engine is not the fake's: polled
        if recorder and recorder[0].closed_early:
            break
        await asyncio.sleep(0.02)
    await settled(bot)
    (engine,) = recorder
    assert [r.request_id for r in engine.requests] == engine.closed_early
    assert slack.bot_messages("C1") == []
    (row,) = await request_rows(bot.store)
    assert row[2] != "ok"
