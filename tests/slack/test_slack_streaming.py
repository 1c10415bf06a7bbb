"""Streaming into Slack: throttled edits (by the fake's clock), splitting within Block Kit limits,
Markdown -> mrkdwn."""

from __future__ import annotations

import asyncio
import time

import pytest
from fakes.slack_harness import BotFactory, has_footer
from fakes.slack_server import FakeSlack

from bot.adapters.slack_format import markdown_to_mrkdwn
from bot.types import FinalAnswer, IncomingMessage, MessageKind, SourceNote

pytestmark = pytest.mark.timeout(120)


def _question(slack: FakeSlack, channel: str = "C1") -> IncomingMessage:
    event = slack.user_message(channel, "U1", "question")
    return IncomingMessage(
        platform="slack",
        event_id=f"{channel}:{event['ts']}",
        channel=channel,
        user="U1",
        text="question",
        kind=MessageKind.MENTION,
        thread_id=str(event["ts"]),
        message_id=str(event["ts"]),
    )


async def test_streamed_edits_are_at_most_one_per_second_and_the_last_carries_the_footer(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot(edit_interval_s=1.0)
    reply = await bot.adapter.open_reply(_question(slack))
    text = ""
    deadline = time.monotonic() + 3.5
    while time.monotonic() < deadline:  # tokens every 20 ms for 3.5 s
        text += "word "
        await reply.update(text)
        await asyncio.sleep(0.02)
    answer = FinalAnswer(
        request_id="req-stream-1",
        text="**Root cause**: the `api` pod is OOM-killed.\n\n- raise the limit\n- check [dash](https://g.example/d)",
        sources=[SourceNote("kubernetes", "ok"), SourceNote("prometheus", "timeout", "after 2.0 s")],
        left_out=["40 older events"],
        ttft_ms=120.0,
        total_ms=2400.0,
        output_tokens=42,
    )
    await reply.finish(answer)
    (msg,) = slack.bot_messages("C1")
    # The first words replace the placeholder at once; edits after that are a second apart.
    times = [at for at, _, _ in msg.edits]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert 2 <= len(msg.edits) <= 6
    assert times[0] - msg.posted_at < 0.5
    assert min(gaps) >= 0.99, f"edits {min(gaps):.3f} s apart"
    assert has_footer(msg)
    section = msg.blocks[0]["text"]["text"]  # type: ignore[index]
    assert (
        "*Root cause*" in section
        and "<https://g.example/d|dash>" in section
        and "• raise the limit" in section
    )
    footer = next(b for b in msg.blocks or [] if b["type"] == "context")["elements"][0]["text"]
    for expected in (
        "kubernetes",
        "prometheus (timeout: after 2.0 s)",
        "40 older events",
        "0.12 s",
        "2.40 s",
    ):
        assert expected in footer
    actions = next(b for b in msg.blocks or [] if b["type"] == "actions")["elements"]
    assert [a["action_id"] for a in actions] == [
        "opsbot_feedback_up:req-stream-1",
        "opsbot_feedback_down:req-stream-1",
    ]


async def test_a_long_answer_is_split_into_messages_and_sections_within_slack_limits(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot(channel_post_interval_s=1.0)  # Slack's one message a second per channel
    paragraphs = [f"Paragraph {i}: " + "the node is under memory pressure. " * 30 for i in range(100)]
    code = "```\n" + "\n".join(f"line {i} of the log <with> & stuff" for i in range(400)) + "\n```"
    text = "\n\n".join(paragraphs[:50] + [code] + paragraphs[50:])
    assert len(text) > 2 * 40_000
    reply = await bot.adapter.open_reply(_question(slack))
    await reply.finish(FinalAnswer(request_id="req-long", text=text))
    msgs = slack.bot_messages("C1")
    assert len(msgs) >= 3
    assert all(c.ok for c in slack.calls if c.method.startswith("chat."))  # the fake validates the limits
    for m in msgs:
        assert len(m.text) <= 40_000
        assert m.text.count("```") % 2 == 0  # code fences never straddle messages
        for block in m.blocks or []:
            if block["type"] == "section":
                assert len(block["text"]["text"]) <= 3000
    assert [has_footer(m) for m in msgs] == [False] * (len(msgs) - 1) + [True]
    assert "&lt;with&gt; &amp; stuff" in "".join(m.text for m in msgs)


@pytest.mark.parametrize(
    ("markdown", "mrkdwn"),
    [
        ("**bold** and __also__", "*bold* and *also*"),
        (
            "see [the runbook](https://r.example/x?a=1&b=2)",
            "see <https://r.example/x?a=1&amp;b=2|the runbook>",
        ),
        ("a < b && c > d", "a &lt; b &amp;&amp; c &gt; d"),
        ("- one\n* two\n  - nested", "• one\n• two\n    • nested"),
        ("## Next steps", "*Next steps*"),
        ("```python\nif a < b:\n    **x**\n```", "```\nif a &lt; b:\n    **x**\n```"),
        ("use `kubectl get <pod>` now", "use `kubectl get &lt;pod&gt;` now"),
        ("~~gone~~", "~gone~"),
    ],
)
def test_markdown_becomes_slack_mrkdwn(markdown: str, mrkdwn: str) -> None:
    assert markdown_to_mrkdwn(markdown) == mrkdwn
