"""Slack's native streaming (``chat.startStream`` / ``appendStream`` / ``stopStream`` through
slack_sdk's ``AsyncChatStream``) against the fake, and the fallback to post-and-edit."""

from __future__ import annotations

import asyncio

import pytest
from fakes.slack_harness import DEFAULTS, BotFactory, answers, has_footer, settled
from fakes.slack_server import STREAM_METHODS, FakeSlack

from bot.adapters.slack_reply import FIRST_PIECE_CHARS, SOURCES_WAIT_S, SlackReply
from bot.types import FinalAnswer, IncomingMessage, MessageKind, SourceNote

pytestmark = pytest.mark.timeout(120)


def _question(slack: FakeSlack, channel: str = "C1", text: str = "question") -> IncomingMessage:
    event = slack.user_message(channel, "U1", text)
    return IncomingMessage(
        platform="slack",
        event_id=f"{channel}:{event['ts']}",
        channel=channel,
        user="U1",
        text=text,
        kind=MessageKind.MENTION,
        thread_id=str(event["ts"]),
        message_id=str(event["ts"]),
        team=slack.team_id,
    )


async def test_an_answer_streams_natively_plan_and_sources_first_then_markdown_then_footer(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot(**DEFAULTS, edit_interval_s=0.2)
    reply = await bot.adapter.open_reply(_question(slack))
    assert isinstance(reply, SlackReply) and reply.rendering == "native"
    (msg,) = slack.bot_messages("C1")
    assert msg.streaming and msg.chunks[0] == {"type": "plan_update", "title": "Looking into it"}
    await reply.show_sources(
        [SourceNote("kubernetes", "ok"), SourceNote("prometheus", "timeout", "after 2.0 s")]
    )
    text = ""
    for i in range(60):  # a word every 20 ms for 1.2 s
        text += f"word{i} "
        await reply.update(text)
        await asyncio.sleep(0.02)
    final = text + "\n\n**done** <!channel>"
    await reply.finish(FinalAnswer(request_id="req-native", text=final, ttft_ms=50.0, total_ms=1300.0))
    assert not msg.streaming
    tasks = {c["title"]: c for c in msg.chunks if c["type"] == "task_update" and c["id"] != "context"}
    assert tasks["kubernetes"]["status"] == "complete"
    assert tasks["prometheus"]["status"] == "error" and "after 2.0 s" in tasks["prometheus"]["output"]
    # The text is appended in pieces, never faster than the edit interval, and the whole answer
    # arrived once; the sources' task update travels with the first words, in one call.
    texts = [(at, text) for at, text in msg.appends if text]
    assert len(texts) >= 3
    gaps = [b - a for (a, _), (b, _) in zip(texts, texts[1:], strict=False)]
    assert min(gaps) >= 0.2 * 0.95, gaps
    appends = [c.params for c in slack.calls if c.method == "chat.appendStream"]
    first_kinds = [chunk["type"] for chunk in appends[0]["chunks"]]
    assert first_kinds == ["task_update"] * 3 + ["markdown_text"], first_kinds
    assert appends[0]["chunks"][-1]["text"] == "word0 "
    assert len(appends) == len(texts) - 1  # every other call carries text; stopStream the rest
    assert msg.text == final.replace("<!channel>", "<\u200b!channel>")  # a mention in model text is defanged
    assert has_footer(msg)
    buttons = [e["action_id"] for b in msg.blocks or [] if b["type"] == "actions" for e in b["elements"]]
    assert buttons == ["opsbot_feedback_up:req-native", "opsbot_feedback_down:req-native"]
    assert msg.metadata is not None and msg.metadata["event_payload"]["request_id"] == "req-native"
    assert not [c for c in slack.calls if c.method == "chat.update"]


async def test_the_sources_go_alone_when_the_first_words_are_late_and_the_first_token_goes_at_once(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot(**DEFAULTS, edit_interval_s=0.2)
    reply = await bot.adapter.open_reply(_question(slack))
    (msg,) = slack.bot_messages("C1")
    await reply.show_sources([SourceNote("kubernetes", "ok")])
    await asyncio.sleep(SOURCES_WAIT_S / 2)
    assert len(msg.chunks) == 2  # the plan and the context task: the sources wait for words
    await slack.wait_for(lambda: len(msg.chunks) == 4, timeout_s=SOURCES_WAIT_S * 4)
    assert msg.text == ""  # the engine is still queued: the sources alone, no text yet
    # The first token goes out at once although it is no whole word yet; after it, whole words.
    await reply.update("Root")
    await slack.wait_for(lambda: msg.text == "Root")
    await reply.update("Root cause: the pas")
    await asyncio.sleep(0.4)
    assert msg.text == "Root cause: the "  # "pas" may still grow into a secret
    # A first word longer than FIRST_PIECE_CHARS shows that much of it at once, the rest once whole.
    other = await bot.adapter.open_reply(_question(slack, "C2"))
    await other.update("   " + "x" * (FIRST_PIECE_CHARS + 4))
    (second,) = slack.bot_messages("C2")
    await slack.wait_for(lambda: second.text == "x" * FIRST_PIECE_CHARS)
    await other.update("x" * (FIRST_PIECE_CHARS + 6))
    await asyncio.sleep(0.3)
    assert second.text == "x" * FIRST_PIECE_CHARS  # the word still grows: nothing more of it
    await reply.finish(FinalAnswer(request_id="req-late", text="Root cause: the password is [REDACTED]"))
    await other.finish(FinalAnswer(request_id="req-long", text="x" * (FIRST_PIECE_CHARS + 6)))
    assert msg.text == "Root cause: the password is [REDACTED]" and not msg.streaming
    assert second.text == "x" * (FIRST_PIECE_CHARS + 6)


async def test_text_rewritten_after_it_was_streamed_is_repaired_with_one_update(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot(**DEFAULTS, edit_interval_s=0.05)
    reply = await bot.adapter.open_reply(_question(slack))
    await reply.update("the password is hunter2 and more ")
    await slack.wait_for(lambda: bool(slack.bot_messages("C1")[0].appends))
    # redaction caught up: the final text no longer starts with what was streamed
    await reply.finish(FinalAnswer(request_id="req-fix", text="the password is [REDACTED] and more"))
    (msg,) = slack.bot_messages("C1")
    assert not msg.streaming and "[REDACTED]" in msg.text and "hunter2" not in msg.text
    assert has_footer(msg)
    assert [c.method for c in slack.calls if c.method == "chat.update"] == ["chat.update"]


async def test_a_long_native_answer_continues_in_posts_with_the_footer_on_the_last(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot(**DEFAULTS)
    reply = await bot.adapter.open_reply(_question(slack))
    text = "\n\n".join(f"Paragraph {i}: " + "memory pressure on the node. " * 20 for i in range(60))
    assert len(text) > 2 * 12_000
    await reply.finish(FinalAnswer(request_id="req-long", text=text))
    msgs = slack.bot_messages("C1")
    assert len(msgs) >= 3 and msgs[0].streamed and not msgs[0].streaming
    assert [has_footer(m) for m in msgs] == [False] * (len(msgs) - 1) + [True]
    assert all(c.ok for c in slack.calls if c.method.startswith("chat."))


@pytest.mark.parametrize("error", ["unknown_method", "not_allowed_token_type", "missing_scope"])
async def test_a_workspace_without_native_streaming_gets_post_and_edit_and_is_remembered(
    slack: FakeSlack, make_bot: BotFactory, error: str
) -> None:
    slack.stream_error = error
    bot = await make_bot(**DEFAULTS)
    for i in range(2):  # one after the other: the second comes once the refusal is known
        event = slack.user_message("C1", "U1", f"<@{slack.bot_user_id}> question {i}")
        await slack.deliver_event(slack.mention_events(event)[0])
        await slack.wait_for(lambda i=i: len(answers(slack, "C1")) == i + 1)  # type: ignore[misc]
    await settled(bot)
    assert [c.method for c in slack.calls if c.method in STREAM_METHODS] == ["chat.startStream"]
    assert bot.adapter.no_streaming == {slack.team_id: error}
    assert len(slack.bot_messages("C1")) == 2


async def test_a_refusal_for_one_channel_falls_back_for_that_answer_only(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    slack.stream_error = "channel_type_not_supported"
    bot = await make_bot(**DEFAULTS)
    first = await bot.adapter.open_reply(_question(slack, "C1"))
    slack.stream_error = None
    second = await bot.adapter.open_reply(_question(slack, "C2"))
    assert isinstance(first, SlackReply) and isinstance(second, SlackReply)
    assert (first.rendering, second.rendering) == ("edit", "native")
    assert bot.adapter.no_streaming == {}
    for reply in (first, second):
        await reply.finish(FinalAnswer(request_id="r", text="ok"))


async def test_a_mention_is_answered_natively_end_to_end_with_the_sources_as_tasks(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot(**DEFAULTS)
    event = slack.user_message("C1", "U1", f"<@{slack.bot_user_id}> why is checkout slow?")
    for e in slack.mention_events(event):
        await slack.deliver_event(e)
    await slack.wait_for(lambda: len(answers(slack, "C1")) == 1)
    await settled(bot)
    (msg,) = slack.bot_messages("C1")
    assert msg.streamed and msg.thread_ts == event["ts"]
    assert {
        "type": "task_update",
        "id": "context",
        "title": "Cluster context",
        "status": "complete",
    } in msg.chunks
